//! `advm vm run`: boots the guest under unmodified QEMU/KVM and waits for its service.
//!
//! With `--disk pmem` the chain is planned by `advm::image::PmemBacking` and QEMU runs
//! with the preload shim (`ADVM_MODE=off`: malloc stays glibc's), which maps the plan
//! where QEMU maps its virtio-pmem backend file. With `--disk blk` QEMU reads the chain
//! itself.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use advm::image::{Image, LayerFormat, LayerStamp, MapOptions, PmemBacking, DUMP_DIR_ENV};
use advm::stats::cgroup::{Group, DEFAULT_INTERVAL};

use super::qemu::{self, Accel, Disk, Settings};
use crate::CliError;

/// The file in a VM's work directory that describes it.
pub const VM_INFO: &str = "vm.json";

/// The pmem device's size is a multiple of this (DAX maps the device in 2 MiB units).
const PMEM_ALIGN: u64 = 2 << 20;

/// `--tb-size` by default, MiB: see docs/vm.md for how much of it a boot fills.
pub const TB_MIB: u64 = 16;

/// `--disk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DiskKind {
    /// FlexMem: virtio-pmem backed by advm's mapping of the chain, mounted with DAX.
    Pmem,
    /// QEMU's qcow2 driver on virtio-blk (each guest caches what it reads).
    Blk,
}

/// `--merge-scope`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MergeScope {
    /// Guest RAM and QEMU's own private anonymous blocks of at least 2 MiB.
    Qemu,
    /// Guest RAM only.
    Ram,
}

/// The smallest of QEMU's own blocks `--merge-scope qemu` merges. QEMU keeps a copy of
/// the guest's kernel (`-kernel`, 7.9 MiB here, the same bytes in every VM) in one
/// such block for as long as it runs, and a 2 MiB block of zeros; its heap and
/// arenas are larger. Smaller mappings (about 1 MiB of QEMU's) are left alone.
/// `--help` names the size in words (`MergeScope::Qemu`'s line): change both.
pub const QEMU_BLOCK_MIN: u64 = 2 << 20;

impl MergeScope {
    /// The agent's smallest mapping for a guest of `mem_mib` MiB: guest RAM is the only
    /// anonymous read-write mapping that large (the translation buffer is executable,
    /// the pmem device a file mapping).
    fn min_bytes(self, mem_mib: u64) -> u64 {
        match self {
            Self::Qemu => QEMU_BLOCK_MIN,
            Self::Ram => mem_mib << 20,
        }
    }
}

/// Arguments of `advm vm run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The chain's top layer (e.g. app.qcow2 from `advm vm image build`).
    #[arg(long)]
    pub image: PathBuf,
    /// What the chain's backing files may lead to (as `advm image`).
    #[command(flatten)]
    pub chain: crate::image_cmd::ChainArgs,
    /// Most bytes to decompress or copy into memory for the pmem device's mapping
    /// (compressed clusters, partial pages; default 256 MiB, as `advm image cat`).
    #[arg(long, value_name = "BYTES")]
    pub max_materialised: Option<u64>,
    /// How the guest sees the disk.
    #[arg(long, value_enum, default_value = "pmem")]
    pub disk: DiskKind,
    /// Guest RAM in MiB (the guest of `advm vm image build` needs at least 112).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(64..=65536))]
    pub mem: u64,
    /// CPU: kvm, tcg, or auto (kvm when /dev/kvm is hardware KVM, else tcg; see docs/vm.md).
    #[arg(long, default_value = "auto")]
    pub accel: String,
    /// The emulator's translation buffer in MiB under tcg (QEMU's default is 1 GiB,
    /// filled as the guest runs; see docs/vm.md).
    #[arg(long, default_value_t = TB_MIB, value_parser = clap::value_parser!(u64).range(1..=2048))]
    pub tb_size: u64,
    /// Mark guest RAM mergeable and run KSM while the VM runs.
    #[arg(long)]
    pub ksm: bool,
    /// Once the guest's service answers (and `--merge-after` seconds later), merge guest
    /// RAM once with advm::merge: pages equal to pages in the store (advmd's at
    /// $ADVM_SOCKET, shared by every VM of the uid; else QEMU's own) are mapped from it
    /// copy-on-write. No scanner runs before or after (see docs/vm.md).
    #[arg(long, conflicts_with = "ksm")]
    pub merge: bool,
    /// Seconds between the service's first answer and the merge: the guest hands back
    /// what it frees while starting (free page reporting) before its RAM is merged.
    #[arg(long, default_value_t = 5.0, requires = "merge")]
    pub merge_after: f64,
    /// Under `--merge`, every this many seconds while the guest boots (until the merge
    /// above), a lookup-only merge: pages the store already holds (other VMs' merged
    /// pages) are mapped from it, none are added. It keeps a booting VM from holding
    /// its whole boot peak until it is ready. 0 (the default): none; measured in
    /// docs/vm.md, they did not lower the memory per VM.
    #[arg(long, default_value_t = 0.0, requires = "merge")]
    pub boot_lookup_every: f64,
    /// What `--merge` merges: `qemu` (guest RAM and QEMU's own private anonymous
    /// blocks of at least 2 MiB: its copy of the guest's kernel, identical in every VM,
    /// its heap and malloc arenas) or `ram` (guest RAM only). See docs/vm.md.
    #[arg(long, value_enum, default_value = "qemu", requires = "merge")]
    pub merge_scope: MergeScope,
    /// Boot the guest without address-space randomisation (kernel, processes, Python's
    /// hashes), so its memory is laid out as in every other such guest: more of it is
    /// equal across VMs for `--merge` and `--ksm`. A security trade-off inside the guest.
    #[arg(long)]
    pub no_aslr: bool,
    /// Keep QEMU's transparent huge pages for guest RAM (by default they are off: a
    /// guest touching one page of 2 MiB would hold all of it on the host).
    #[arg(long)]
    pub thp: bool,
    /// The guest's service keeps writing files (a workload for `advm vm dump`); the
    /// guest's root is mounted read-write only then.
    #[arg(long)]
    pub guest_writes: bool,
    /// Kernel (default: vmlinuz beside the image).
    #[arg(long)]
    pub kernel: Option<PathBuf>,
    /// Initramfs (default: initrd.img beside the image).
    #[arg(long)]
    pub initrd: Option<PathBuf>,
    /// Seconds to wait for the guest's service.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Stop the VM once it is ready (for scripts and tests).
    #[arg(long)]
    pub exit_when_ready: bool,
    /// Run QEMU in its own memory cgroup: say on stderr what is charged to it when the
    /// guest is ready, and after QEMU exits the anon+shmem and page cache charged to it
    /// (mean and peak, sampled every 50 ms). Needs root (see docs/vm.md for what a VM's
    /// group holds and what it does not).
    #[arg(long)]
    pub cgroup: bool,
    /// Report on stdout as JSON, one object per line and event (`ready`,
    /// `cgroup_at_ready`, `merged`, `layer_written`, and `exit` last, with the --cgroup
    /// report); stderr keeps only notes and the error (docs/vm.md).
    #[arg(long)]
    pub json: bool,
    /// The QEMU program.
    #[arg(long, default_value = "qemu-system-x86_64")]
    pub qemu: String,
    /// Extra QEMU arguments, after advm's (-qmp, -smp, -device...); the options advm
    /// sets itself (-m, -kernel, -initrd, -append, -accel, -machine) are refused.
    #[arg(last = true)]
    pub extra: Vec<String>,
}

/// A started VM.
pub struct Vm {
    pub child: Child,
    pub port: u16,
    pub console: PathBuf,
    pub qemu_log: PathBuf,
    pub started: Instant,
    /// Guest RAM in MiB and the pmem device's size (0 under blk), for [`memory_hint`].
    pub mem_mib: u64,
    pmem_bytes: u64,
    /// The chain as opened before QEMU started, each layer's stamp then (and its
    /// external data file's), and whether a change was reported: [`Vm::check_layers`].
    image: Image,
    stamps: Vec<(LayerStamp, Option<LayerStamp>, bool)>,
    /// `--json`: reports are [`event`] lines.
    json: bool,
    _backing: Option<PmemBacking>,
}

/// One `--json` report: the object `fields` with `"event": name`, as one line on stdout.
/// A reader that has gone (`| head -1`) does not stop the VM: it runs on until killed.
fn event(name: &str, fields: serde_json::Value) {
    let mut v = serde_json::json!({ "event": name });
    if let (Some(o), serde_json::Value::Object(f)) = (v.as_object_mut(), fields) {
        o.extend(f);
    }
    let _ = crate::write_out(format_args!("{v}\n"));
}

/// Guest RAM the guest of `advm vm image build` boots and answers in, measured for both
/// disk methods (TCG, 2026-11-28): 112 MiB answered in 24 s; at 96 MiB a pmem guest ran
/// out of memory in its initramfs and a blk guest did not answer within 140 s (its page
/// cache too small for the service's files); at 64 MiB the kernel stopped before its
/// first console line.
pub const MIN_GUEST_MIB: u64 = 112;

/// Guest RAM, in MiB rounded up, that the guest's kernel takes for the page structures
/// of a pmem device of `bytes`: DAX maps the device's pages, so each 4 KiB page has a
/// 64-byte `struct page` in RAM (8 MiB for the built guest's 512 MiB disk, within
/// [`MIN_GUEST_MIB`]; 16 GiB for a 1 TiB disk).
pub fn pmem_page_structs_mib(bytes: u64) -> u64 {
    (bytes / 64).div_ceil(1 << 20)
}

/// The page structures of the built guest's 512 MiB device, counted in [`MIN_GUEST_MIB`].
const BUILT_PAGE_STRUCTS_MIB: u64 = 8;

/// A line naming guest memory as the likely reason the guest did not answer: the
/// guest's kernel said it ran out of memory, or `mem_mib` is below what the built guest
/// needs with a pmem device of `pmem_bytes` (0 under blk). None when neither holds.
pub fn memory_hint(console: &str, mem_mib: u64, pmem_bytes: u64) -> Option<String> {
    let structs = pmem_page_structs_mib(pmem_bytes);
    let extra = structs.saturating_sub(BUILT_PAGE_STRUCTS_MIB);
    let need = MIN_GUEST_MIB + extra;
    let why = if extra > 0 {
        format!(
            "{need} MiB with this disk: {MIN_GUEST_MIB}, and {extra} MiB more for the page structures of its              {} MiB pmem device (64 bytes per 4 KiB page; or use --disk blk)",
            pmem_bytes >> 20
        )
    } else {
        format!("{MIN_GUEST_MIB} MiB")
    };
    let oom = ["Out of memory", "System is deadlocked on memory", "oom-kill"].iter().any(|m| console.contains(m));
    if oom {
        return Some(format!(
            "the guest ran out of memory with --mem {mem_mib} (the guest of `advm vm image build` needs at least \
             {why}; a larger service more)"
        ));
    }
    (mem_mib < need).then(|| {
        format!(
            "--mem {mem_mib} is below what the guest of `advm vm image build` needs, {why} (below it the kernel \
             may stop before it prints anything, or the guest may page its files in and out for ever)"
        )
    })
}

fn usage(s: String) -> CliError {
    CliError::Usage(s)
}

/// Whether /dev/kvm runs unmodified guests: hardware KVM (kvm_intel, kvm_amd). PVM
/// (kvm_pvm, KVM for VMs without hardware virtualisation) only runs kernels built as PVM
/// guests, which Debian's is not.
fn hardware_kvm() -> bool {
    ["kvm_intel", "kvm_amd"].iter().any(|m| Path::new("/sys/module").join(m).exists())
}

/// Why /dev/kvm could not be opened, and what to do: for a user refused by its
/// permissions, the group that grants it (it used to say KVM needs hardware
/// virtualisation, which the machine may well have).
fn kvm_open_failure(e: &std::io::Error, dev: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    if e.kind() != std::io::ErrorKind::PermissionDenied {
        return format!("{}: {e}; --accel kvm needs KVM (hardware virtualisation)", dev.display());
    }
    let Ok(meta) = std::fs::metadata(dev) else {
        return format!("{}: {e}; KVM needs read-write access to it", dev.display());
    };
    let group = std::fs::read_to_string("/etc/group")
        .ok()
        .and_then(|g| {
            g.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() > 2 && f[2].parse() == Ok(meta.gid())).then(|| f[0].to_string())
            })
        })
        .unwrap_or_else(|| meta.gid().to_string());
    let fix = if meta.mode() & 0o060 == 0o060 {
        format!("add the user to group {group} (then log in again)")
    } else {
        let to = if meta.gid() == 0 { "a group such as kvm".to_string() } else { format!("group {group}") };
        format!(
            "it is mode {:o}, its owner's alone: give {to} read-write access to it (a udev rule) and add the user to it",
            meta.mode() & 0o777
        )
    };
    format!(
        "{}: {e}: this user (uid {}) may not use KVM, which needs read-write access to it; {fix}",
        dev.display(),
        advm::process::euid()
    )
}

/// Resolves `--accel`: `kvm` needs /dev/kvm (an error names what is missing), `auto`
/// falls back to tcg with a note.
pub fn accel(requested: &str) -> Result<Accel, CliError> {
    let kvm = || -> Result<(), String> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .map_err(|e| kvm_open_failure(&e, Path::new("/dev/kvm")))?;
        if !hardware_kvm() {
            return Err("/dev/kvm is not hardware KVM (no kvm_intel or kvm_amd module; kvm_pvm runs only PVM \
                        guest kernels, and Debian's kernel is not one)"
                .into());
        }
        Ok(())
    };
    match requested {
        "kvm" => kvm().map(|()| Accel::Kvm).map_err(usage),
        "tcg" => Ok(Accel::Tcg),
        "auto" => Ok(kvm().map(|()| Accel::Kvm).unwrap_or_else(|why| {
            eprintln!("advm vm run: {why}; using QEMU's emulator (tcg)");
            Accel::Tcg
        })),
        other => Err(usage(format!("--accel {other}: expected kvm, tcg or auto"))),
    }
}

/// Checks what a VM needs before anything starts: the image, QEMU, kernel, initrd.
pub fn preflight(image: &Path, qemu: &str, kernel: &Path, initrd: &Path) -> Result<(), CliError> {
    // First: the kernel and initrd default to files beside it. A block device (an LVM
    // volume) is an image too; what is neither is refused by name when it is opened.
    if !image.exists() {
        return Err(usage(format!("image {}: not found (--image names the chain's top qcow2 layer)", image.display())));
    }
    // Before the kernel beside it is looked for: that was named instead (`kernel
    // /tmp/vmlinuz: not found` for `--image /tmp/DIR`, the directory of a build).
    if image.is_dir() {
        return Err(usage(format!(
            "image {}: is a directory (--image names the chain's top qcow2 layer, e.g. DIR/app.qcow2 of `advm vm \
             image build --out DIR`)",
            image.display()
        )));
    }
    let found = if qemu.contains('/') {
        Path::new(qemu).is_file()
    } else {
        std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(qemu).is_file()))
    };
    if !found {
        return Err(usage(format!("{qemu}: not found; install qemu-system-x86 (`make deps`)")));
    }
    for (what, p) in [("kernel", kernel), ("initrd", initrd)] {
        if !p.is_file() {
            return Err(usage(format!(
                "{what} {}: not found; build the guest with `advm vm image build` or pass --{what}",
                p.display()
            )));
        }
    }
    let head = |p: &Path| -> Result<Vec<u8>, CliError> {
        let mut head = Vec::new();
        std::fs::File::open(p)
            .and_then(|f| f.take(BOOT_HEAD).read_to_end(&mut head))
            .map_err(|e| CliError::Io(p.display().to_string(), e))?;
        Ok(head)
    };
    if !is_kernel(&head(kernel)?) {
        return Err(usage(format!(
            "kernel {}: not a kernel QEMU boots (no bzImage header, ELF or multiboot header); pass the guest's \
             vmlinuz with --kernel",
            kernel.display()
        )));
    }
    if !is_initramfs(&head(initrd)?) {
        return Err(usage(format!(
            "initrd {}: not an initramfs (neither a cpio archive nor one compressed with gzip, bzip2, lzma, xz, lzo, \
             lz4 or zstd); pass the guest's initrd.img with --initrd",
            initrd.display()
        )));
    }
    Ok(())
}

/// How much of a kernel or initramfs [`preflight`] reads: a multiboot header is within
/// the first 8 KiB.
const BOOT_HEAD: u64 = 8192;

/// Whether `head` (a file's first [`BOOT_HEAD`] bytes) starts a kernel QEMU's `-kernel`
/// loads on x86: a Linux bzImage (`HdrS` at 0x202), an ELF file (PVH), or a multiboot
/// image. Anything else QEMU takes for a very old Linux and refuses with "linux kernel
/// too old to load a ram disk", which does not say that the file is not a kernel.
fn is_kernel(head: &[u8]) -> bool {
    let bz = head.get(0x202..0x206) == Some(b"HdrS");
    let multiboot = head.chunks_exact(4).any(|w| w == 0x1BAD_B002u32.to_le_bytes());
    bz || head.starts_with(b"\x7fELF") || multiboot
}

/// Whether `head` starts an initramfs the kernel unpacks: a cpio archive (newc, crc or
/// old ASCII), or one compressed by a method Linux may have built in. The kernel skips
/// NUL padding before an archive, and so does this.
fn is_initramfs(head: &[u8]) -> bool {
    const MAGICS: [&[u8]; 11] = [
        b"070701",
        b"070702",
        b"070707",
        b"\x1f\x8b",
        b"\x1f\x9e",
        b"BZh",
        b"\x5d\x00\x00",
        b"\xfd7zXZ\x00",
        b"\x89LZO",
        b"\x02\x21\x4c\x18",
        b"\x28\xb5\x2f\xfd",
    ];
    let start = head.iter().position(|&b| b != 0).unwrap_or(head.len());
    MAGICS.iter().any(|m| head[start..].starts_with(m))
}

/// Whether the kernel refuses to overcommit memory (`vm.overcommit_memory` 2). Elsewhere
/// the pmem device is mapped without reserving commit for all of it (`reserve=off`):
/// a guest writes few of its pages, and a private writable mapping reserved whole was
/// refused once it was larger than RAM and swap (a 1 TiB sparse disk: QEMU said
/// "unable to map backing store for guest RAM: Cannot allocate memory"). Under mode 2
/// QEMU refuses `reserve=off` ("Skipping reservation of swap space is not supported").
fn strict_overcommit() -> bool {
    std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|m| m.trim() == "2")
}

fn free_port() -> Result<u16, CliError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| CliError::Io("binding a local port".into(), e))?;
    Ok(l.local_addr().map_err(|e| CliError::Io("local port".into(), e))?.port())
}

/// The pmem device's plan: from `advmd`'s image service when a daemon answers at
/// `$ADVM_SOCKET` (the chain's plan is computed once for every VM), else planned here.
fn pmem_backing(top: &Path, image: &Image, options: MapOptions) -> Result<PmemBacking, CliError> {
    let socket = advm::wire::socket_path();
    if let Ok(ch) = advm::wire::Channel::connect(&socket) {
        let t = std::time::Instant::now();
        match advm::image::service::fetch(&ch, top).and_then(|f| {
            let cached = f.cached;
            PmemBacking::from_service(f, PMEM_ALIGN, &options.image).map(|b| (b, cached))
        }) {
            Ok((b, cached)) => {
                eprintln!(
                    "advm vm run: plan from advmd at {} in {:.1} ms ({})",
                    socket.display(),
                    t.elapsed().as_secs_f64() * 1e3,
                    if cached { "computed before" } else { "computed now" }
                );
                return Ok(b);
            }
            Err(e) => {
                eprintln!("advm vm run: advmd at {} did not serve the image ({e}); planning here", socket.display())
            }
        }
    }
    Ok(PmemBacking::new(image, &options, PMEM_ALIGN)?)
}

/// QEMU's preload environment: the shim when the disk is pmem (`shim`: it maps the
/// plan; `ADVM_MODE=off` keeps glibc's malloc), the merge agent under `--merge`
/// (`agent`: libadvm.so). The agent merges only private anonymous read-write mappings
/// of at least `min_bytes` ([`MergeScope::min_bytes`]), never thread stacks nor its own,
/// and never by itself: `advm vm run` asks it once.
fn preload_env(shim: Option<&Path>, agent: Option<&Path>, min_bytes: u64) -> Vec<(&'static str, String)> {
    let libs: Vec<String> = shim.iter().chain(agent.iter()).map(|p| p.display().to_string()).collect();
    let mut env = Vec::new();
    if !libs.is_empty() {
        env.push(("LD_PRELOAD", libs.join(":")));
    }
    if shim.is_some() {
        env.push((advm_preload::env::MODE, "off".to_string()));
    }
    if agent.is_some() {
        use advm::merge::agent::{ENV_AGENT, ENV_MIN_BYTES, ENV_MIN_GROWTH};
        env.push((ENV_AGENT, "1".to_string()));
        env.push((ENV_MIN_BYTES, min_bytes.to_string()));
        // 1 EiB of growth: never reached, so no quiet period starts a merge.
        env.push((ENV_MIN_GROWTH, (1u64 << 60).to_string()));
    }
    env
}

/// CPU seconds the merge agent's threads in process `pid` have used (`advm-merge` and
/// its fence's servicer `advm-merge-wp`; /proc counts USER_HZ ticks, 100 per second).
fn agent_cpu_seconds(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0.0 };
    let mut ticks = 0u64;
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else { continue };
        // `TID (COMM) STATE ...`: utime and stime are fields 14 and 15.
        let Some((head, rest)) = stat.rsplit_once(") ") else { continue };
        if !head.split_once(" (").is_some_and(|(_, comm)| comm.starts_with("advm-merge")) {
            continue;
        }
        let f: Vec<u64> = rest.split(' ').skip(11).take(2).filter_map(|x| x.parse().ok()).collect();
        ticks += f.iter().sum::<u64>();
    }
    ticks as f64 / 100.0
}

/// `--merge`: asks the agent in QEMU (process `qemu`) to merge guest RAM now. The
/// agent's reply (counts in pages, `seconds`, `via`) with the request's wall time
/// (`wall_s`) and the CPU the agent's threads spent (`agent_cpu_s`; advmd's own, when
/// it holds the store, is not in it).
fn merge_guest(qemu: u32) -> Result<serde_json::Value, CliError> {
    let cpu = agent_cpu_seconds(qemu);
    let t = Instant::now();
    let mut reply = advm::merge::agent::request_kind(qemu, true)?;
    if reply["ok"] != true {
        return Err(usage(format!("merging guest RAM: {}", reply["error"].as_str().unwrap_or("no reason given"))));
    }
    reply["wall_s"] = t.elapsed().as_secs_f64().into();
    reply["agent_cpu_s"] = (agent_cpu_seconds(qemu) - cpu).into();
    Ok(reply)
}

/// `--boot-lookup-every`: a thread that asks the agent in QEMU (process `qemu`) for a
/// lookup-only merge every `every` until dropped. It reports nothing but a failure's
/// reason on stderr (once): a guest still booting may be killed, or its agent not up yet.
struct BootLookups {
    stop: std::sync::mpsc::Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BootLookups {
    fn start(qemu: u32, every: Duration) -> Self {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let mut told = false;
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                let why = match advm::merge::agent::request_kind(qemu, false) {
                    Ok(r) if r["ok"] == true => continue,
                    Ok(r) => r["error"].as_str().unwrap_or("no reason given").to_string(),
                    Err(e) => e.to_string(),
                };
                if !told {
                    eprintln!("advm vm run: a lookup-only merge while booting failed: {why}");
                    told = true;
                }
            }
        });
        Self { stop, thread: Some(thread) }
    }
}

impl Drop for BootLookups {
    fn drop(&mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Each layer's external data file, (depth, absolute path), for QEMU's command line: QEMU
/// resolves a relative data file name in its working directory, advm beside the layer.
fn data_files(image: &Image) -> Result<Vec<(usize, PathBuf)>, CliError> {
    let mut out = Vec::new();
    for (depth, layer) in image.layers().iter().enumerate() {
        if let Some(p) = layer.data_file() {
            out.push((depth, std::path::absolute(p).map_err(|e| CliError::Io(p.display().to_string(), e))?));
        }
    }
    Ok(out)
}

/// `--disk blk` of a chain with an encrypted layer: QEMU opens no encrypted layer without
/// its key, which advm cannot pass, and it said so only once started ("Parameter
/// 'encrypt.key-secret' is required for cipher"). Refused before, with the way out.
fn refuse_encrypted(image: &Image) -> Result<(), CliError> {
    let Some(l) = image.info().into_iter().find(|l| l.crypt_method != 0) else { return Ok(()) };
    let how = if l.crypt_method == 1 { "AES" } else { "LUKS" };
    Err(usage(format!(
        "--disk blk: layer {} is encrypted ({how}) and QEMU opens it only with its key, which advm vm run cannot give \
         it; decrypt the chain first (qemu-img convert --object secret,id=k,file=KEYFILE --image-opts \
         driver=qcow2,file.filename={},encrypt.key-secret=k -O qcow2 plain.qcow2)",
        l.path.display(),
        l.path.display()
    )))
}

/// Starts QEMU for `args` (checked by [`preflight`] first).
pub fn start(args: &RunArgs, workdir: &Path, group: Option<&Group>) -> Result<Vm, CliError> {
    let dir = args.image.parent().map(Path::to_path_buf).unwrap_or_default();
    let kernel = args.kernel.clone().unwrap_or_else(|| dir.join("vmlinuz"));
    let initrd = args.initrd.clone().unwrap_or_else(|| dir.join("initrd.img"));
    preflight(&args.image, &args.qemu, &kernel, &initrd)?;
    qemu::check_extra(&args.extra).map_err(usage)?;
    let accel = accel(&args.accel)?;
    let image = Image::open_with(&args.image, &args.chain.options())?;
    // The top as named, made absolute but not through its symlinks: QEMU (blk) and a
    // dump's overlay resolve a relative backing name beside the name they are given,
    // as advm did above. Canonical, a symlinked top led QEMU to the backing file beside
    // the link's target, another chain than the one checked and mapped for pmem.
    let top = std::path::absolute(&args.image).map_err(|e| CliError::Io(args.image.display().to_string(), e))?;
    if !args.thp {
        advm::process::disable_thp()?;
    }
    // A disk of size 0 (an empty file, a qcow2 created without a size) holds no root:
    // pmem could not map it, and a blk guest waited out --timeout with nothing to mount.
    if image.virtual_size() == 0 {
        return Err(usage(format!("{}: the disk's virtual size is 0; there is nothing to boot", args.image.display())));
    }
    let (disk, backing) = match args.disk {
        DiskKind::Pmem => {
            let options = MapOptions {
                image: args.chain.options(),
                writable: true,
                max_materialised_bytes: args.max_materialised,
                ..Default::default()
            };
            // Every page of the device has its page structure in guest RAM: a device
            // of 16 GiB takes 256 MiB of it, and a guest of less ran out of memory
            // while it booted; a 1 TiB one was refused by QEMU ("phys-bits too low").
            let structs = pmem_page_structs_mib(image.virtual_size().next_multiple_of(PMEM_ALIGN));
            if structs >= args.mem {
                return Err(usage(format!(
                    "--disk pmem: the guest's kernel needs {structs} MiB of its RAM for the page structures of the \
                     {}-byte disk (64 bytes per 4 KiB page of the device), more than --mem {}; give it --mem \
                     {} or more (the guest of `advm vm image build`), or use --disk blk",
                    image.virtual_size(),
                    args.mem,
                    MIN_GUEST_MIB + structs.saturating_sub(BUILT_PAGE_STRUCTS_MIB)
                )));
            }
            let b = pmem_backing(&args.image, &image, options)?;
            (Disk::Pmem { backing: b.backing_path(), size: b.size(), reserve: strict_overcommit() }, Some(b))
        }
        DiskKind::Blk => {
            refuse_encrypted(&image)?;
            let format = match image.layers()[0].format() {
                LayerFormat::Qcow2 => "qcow2",
                LayerFormat::Raw => "raw",
                other => return Err(usage(format!("--disk blk: a top layer of format {other:?}"))),
            };
            let force_share = args.chain.options().force_share;
            (Disk::Blk { image: top.clone(), format, force_share, data_files: data_files(&image)? }, None)
        }
    };
    // Made only now: a chain refused above leaves no (empty) directory "kept" behind.
    std::fs::create_dir_all(workdir).map_err(|e| CliError::Io(workdir.display().to_string(), e))?;
    let console = workdir.join("console.log");
    let qemu_log = workdir.join("qemu.log");
    // A port found free can be taken by another VM starting at the same moment; QEMU
    // then fails at once, and another port is tried.
    let mut attempt = 0;
    let (child, port, started) = loop {
        attempt += 1;
        let port = free_port()?;
        let settings = Settings {
            qemu: args.qemu.clone(),
            kernel: kernel.clone(),
            initrd: initrd.clone(),
            disk: disk.clone(),
            mem_mib: args.mem,
            accel,
            tb_mib: args.tb_size,
            ksm: args.ksm,
            no_aslr: args.no_aslr,
            guest_writes: args.guest_writes,
            port,
            console: console.clone(),
            extra: args.extra.clone(),
        };
        let log = std::fs::File::create(&qemu_log).map_err(|e| CliError::Io(qemu_log.display().to_string(), e))?;
        let mut cmd = Command::new(&settings.qemu);
        cmd.args(qemu::args(&settings))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| CliError::Io("qemu log".into(), e))?)
            .stderr(log);
        let shim = backing.as_ref().map(|_| advm_preload::launch::shim_path()).transpose()?;
        let agent = args.merge.then(advm_preload::launch::agent_library).transpose()?;
        cmd.envs(preload_env(shim.as_deref(), agent.as_deref(), args.merge_scope.min_bytes(args.mem)));
        if let Some(b) = &backing {
            let (k, v) = b.env();
            cmd.env(k, v).env(DUMP_DIR_ENV, workdir);
        }
        if let Some(g) = group {
            g.join_at_exec(&mut cmd)?;
        }
        let started = Instant::now();
        let mut child = cmd.spawn().map_err(|e| CliError::Io(format!("starting {}", settings.qemu), e))?;
        std::thread::sleep(Duration::from_millis(500));
        let taken = child.try_wait().ok().flatten().is_some()
            && std::fs::read_to_string(&qemu_log).is_ok_and(|l| l.contains("Could not set up host forwarding"));
        if !taken || attempt == 5 {
            break (child, port, started);
        }
    };
    // What `advm vm dump` needs to find and describe this VM.
    let info = serde_json::json!({
        "qemu_pid": child.id(),
        "image": top,
        "disk": if backing.is_some() { "pmem" } else { "blk" },
        "size": backing.as_ref().map(PmemBacking::size),
        // the dump's overlay names it as its backing file's format
        "format": image.layers()[0].format(),
        // the chain's external data files, (depth, absolute path): a dump's overlay
        // is opened by qemu-img, which looks for a relative name in its working directory
        "data_files": data_files(&image)?,
    });
    std::fs::write(workdir.join(VM_INFO), info.to_string()).map_err(|e| CliError::Io(VM_INFO.into(), e))?;
    let stamps = image
        .layers()
        .iter()
        .map(|l| Ok::<_, advm::Error>((l.stamp()?, l.data_stamp()?, false)))
        .collect::<Result<_, _>>()?;
    Ok(Vm {
        child,
        port,
        console,
        qemu_log,
        started,
        mem_mib: args.mem,
        pmem_bytes: backing.as_ref().map_or(0, PmemBacking::size),
        image,
        stamps,
        json: args.json,
        _backing: backing,
    })
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// One HTTP GET of `/`: the body when the answer is 200.
pub fn get(port: u16) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.split_whitespace().nth(1).filter(|c| *c == "200").map(|_| body.trim().to_string())
}

impl Vm {
    /// Waits until the service answers: the time since start and the answer; on
    /// timeout or early exit the VM is stopped and the error has the console's tail.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<(Duration, String), CliError> {
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| CliError::Io("waiting for QEMU".into(), e))? {
                return Err(usage(format!(
                    "QEMU exited ({status}) before the guest's service answered\nQEMU said:\n{}\nconsole tail:\n{}{}",
                    tail(&self.qemu_log, 10),
                    tail(&self.console, 20),
                    self.hint()
                )));
            }
            if let Some(body) = get(self.port) {
                return Ok((self.started.elapsed(), body));
            }
            self.check_layers();
            if self.started.elapsed() > timeout {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(usage(format!(
                    "the guest's service did not answer within {} s; console tail:\n{}{}",
                    timeout.as_secs(),
                    tail(&self.console, 20),
                    self.hint()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Says on stderr, once per layer, that a layer of the chain was written in place
    /// since QEMU started. advm cannot stop it: a writer that is not QEMU takes no lock
    /// (QEMU, qemu-img and qemu-io are refused while a pmem device maps the layer).
    /// The running guest may read the new bytes under a filesystem that never wrote
    /// them: with pmem, in every page of the layer it has not written itself (the
    /// layer is mapped copy-on-write from the host's page cache); with blk, whatever
    /// QEMU reads next. A file put in the layer's place under its name is not a change:
    /// the VM keeps reading the file it opened.
    pub fn check_layers(&mut self) {
        for (layer, (then, data_then, told)) in self.image.layers().iter().zip(self.stamps.iter_mut()) {
            if *told {
                continue;
            }
            let data_changed = || match (data_then, layer.data_stamp()) {
                (Some(then), Ok(Some(now))) => then.changed_in_place(&now),
                _ => false,
            };
            let data_file = if layer.stamp().is_ok_and(|now| then.changed_in_place(&now)) {
                None
            } else if data_changed() {
                layer.data_file()
            } else {
                continue;
            };
            *told = true;
            if self.json {
                event("layer_written", serde_json::json!({ "layer": layer.path(), "data_file": data_file }));
                continue;
            }
            let what = match data_file {
                None => format!("layer {}", layer.path().display()),
                Some(p) => format!("the external data file {} of layer {}", p.display(), layer.path().display()),
            };
            eprintln!(
                "advm vm run: warning: {what} was written in place while the VM runs; the guest may read the new \
                 bytes under a filesystem that did not write them (stop the VM; change a chain only by new files: \
                 an overlay, or qemu-img convert then mv)"
            );
        }
    }

    /// Waits for QEMU to exit, watching the chain's layers ([`Vm::check_layers`]).
    fn wait(&mut self) -> Result<std::process::ExitStatus, CliError> {
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| CliError::Io("waiting for QEMU".into(), e))? {
                return Ok(status);
            }
            self.check_layers();
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// [`memory_hint`] for this VM's console, as a last line of an error ("" when none).
    fn hint(&self) -> String {
        let console =
            std::fs::read(&self.console).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
        memory_hint(&console, self.mem_mib, self.pmem_bytes).map(|h| format!("\nhint: {h}")).unwrap_or_default()
    }

    /// Stops QEMU (SIGKILL: its state is disposable) unless it has ended, and reaps it:
    /// its exit status.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(status);
        }
        let _ = self.child.kill();
        self.child.wait().ok()
    }
}

/// The directory of the VM `advm vm run` process `pid` runs: console, logs, dumps.
pub fn workdir_of(pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("advm-vm-{pid}"))
}

/// How a run went, for `--json`'s `exit` event.
#[derive(Default)]
struct End {
    /// QEMU was started (a run refused before has no cgroup report).
    started: bool,
    /// The guest's service answered.
    ready: bool,
    /// QEMU's status, once advm saw it end.
    qemu: Option<std::process::ExitStatus>,
    /// `--cgroup --json`: the group's report, after QEMU exited.
    cgroup: Option<advm::stats::cgroup::Summary>,
}

/// `--json`'s last line: how the run ended (`result`), and with `--cgroup` its report.
fn exit_event(end: &End, result: &Result<bool, CliError>, kept: Option<&Path>) {
    use std::os::unix::process::ExitStatusExt;
    event(
        "exit",
        serde_json::json!({
            "ok": result.is_ok(),
            "error": result.as_ref().err().map(ToString::to_string),
            "started": end.started,
            "ready": end.ready,
            "signal": advm::process::ForwardSignals::last_received(),
            "qemu_exit_code": end.qemu.and_then(|s| s.code()),
            "qemu_signal": end.qemu.and_then(|s| s.signal()),
            "kept": kept,
            "cgroup": end.cgroup,
        }),
    );
}

/// Runs `advm vm run`. The work directory (console, logs, dump scratch) goes when the
/// VM ends cleanly or is stopped by a signal, and stays, named on stderr, when anything
/// else failed. With `--json` the last line on stdout is an `exit` event, whatever
/// happened after the arguments were read.
pub fn run(args: RunArgs) -> Result<(), CliError> {
    if !(args.merge_after.is_finite() && (0.0..=3600.0).contains(&args.merge_after)) {
        return Err(usage(format!("--merge-after {}: expected seconds from 0 to 3600", args.merge_after)));
    }
    if !(args.boot_lookup_every.is_finite() && (0.0..=3600.0).contains(&args.boot_lookup_every)) {
        return Err(usage(format!("--boot-lookup-every {}: expected seconds from 0 to 3600", args.boot_lookup_every)));
    }
    let work = workdir_of(std::process::id());
    let mut end = End::default();
    let result = run_measured(&args, &work, &mut end);
    let mut kept = None;
    match &result {
        // also when stopped on request (Ctrl-C, a benchmark ending): nothing to look into
        Ok(true) => {
            let _ = std::fs::remove_dir_all(&work);
        }
        _ if advm::process::ForwardSignals::last_received().is_some() => {
            let _ = std::fs::remove_dir_all(&work);
        }
        _ if work.exists() => {
            eprintln!("advm vm run: console and logs kept in {}", work.display());
            kept = Some(work.as_path());
        }
        _ => {}
    }
    if args.json {
        exit_event(&end, &result, kept);
    }
    result.map(|_| ())
}

/// [`run_in`] inside `--cgroup`'s group, whose report follows: on stderr, or with
/// `--json` in `end` for the `exit` event.
fn run_measured(args: &RunArgs, work: &Path, end: &mut End) -> Result<bool, CliError> {
    let group = if args.cgroup { Some(Group::create("vm")?) } else { None };
    let sampler = group.as_ref().map(|g| g.sample_every(DEFAULT_INTERVAL));
    let result = run_in(args, work, group.as_ref(), end);
    if let (Some(g), Some(sampler)) = (group, sampler) {
        if !end.started {
            // Refused before QEMU started: the group never held it, and a report of
            // zeros printed before the refusal read as a measured VM.
            let _ = sampler.stop();
            g.release()?;
        } else if args.json {
            end.cgroup = Some(sampler.stop()?);
            g.release()?;
        } else {
            crate::run_cmd::report_cgroup("advm vm run", g, sampler, false)?;
        }
    }
    result
}

/// Runs the VM in `work`; true when it ended cleanly. QEMU is stopped whatever failed.
fn run_in(args: &RunArgs, work: &Path, group: Option<&Group>, end: &mut End) -> Result<bool, CliError> {
    // Held from before QEMU starts: a SIGTERM while it starts still lets the KSM
    // settings be restored.
    let signals = advm::process::ForwardSignals::hold()?;
    let _ksm = if args.ksm { Some(advm::ksm::Session::start(1000, 20)?) } else { None };
    let mut vm = start(args, work, group)?;
    end.started = true;
    let result = drive(args, &mut vm, group, signals, end);
    end.qemu = vm.stop();
    result
}

/// Waits for the guest to answer, reports it, merges it (`--merge`) and waits for QEMU
/// to exit (or stops it: `--exit-when-ready`).
fn drive(
    args: &RunArgs,
    vm: &mut Vm,
    group: Option<&Group>,
    signals: advm::process::ForwardSignals,
    end: &mut End,
) -> Result<bool, CliError> {
    signals.child(vm.child.id())?;
    let lookups = (args.merge && args.boot_lookup_every > 0.0)
        .then(|| BootLookups::start(vm.child.id(), Duration::from_secs_f64(args.boot_lookup_every)));
    let (t, body) = match vm.wait_ready(Duration::from_secs(args.timeout)) {
        Ok(ready) => ready,
        // Ctrl-C, SIGTERM or SIGHUP while the guest boots (forwarded to QEMU, which
        // ended): stopped on request, not a guest that failed to come up.
        Err(_) if advm::process::ForwardSignals::last_received().is_some() => {
            drop(signals);
            vm.stop();
            if !args.json {
                eprintln!("advm vm run: stopped before the guest's service answered");
            }
            return Ok(false);
        }
        Err(e) => return Err(e),
    };
    end.ready = true;
    let url = format!("http://127.0.0.1:{}/", vm.port);
    let me = std::process::id();
    if args.json {
        event(
            "ready",
            serde_json::json!({
                "url": url,
                "port": vm.port,
                "after_ms": t.as_millis() as u64,
                "answer": body,
                "console": vm.console,
                "vm": me,
                "qemu_pid": vm.child.id(),
            }),
        );
    } else {
        // The VM runs on when the reader of stdout has gone (`| head -1`): until killed.
        let _ = crate::write_out(format_args!("ready: {url} answered after {} ms ({body})\n", t.as_millis()));
        eprintln!("console: {}; dump with `advm vm dump --vm {me}`", vm.console.display());
    }
    if let Some(g) = group {
        let u = g.usage()?;
        if args.json {
            event(
                "cgroup_at_ready",
                serde_json::json!({
                    "group": g.path(),
                    "anon_bytes": u.anon_bytes,
                    "shmem_bytes": u.shmem_bytes,
                    "anon_shmem_bytes": u.anon_shmem_bytes(),
                    "page_cache_bytes": u.page_cache_bytes,
                }),
            );
        } else {
            eprintln!(
                "advm vm run: memory cgroup {} at ready: anon+shmem {}, page cache {}",
                g.path().display(),
                advm_bench::fmt_bytes(u.anon_shmem_bytes()),
                advm_bench::fmt_bytes(u.page_cache_bytes)
            );
        }
    }
    if args.merge {
        std::thread::sleep(Duration::from_secs_f64(args.merge_after));
        drop(lookups);
        // A VM stopped meanwhile (a signal forwarded to QEMU) ends as it would unmerged.
        if vm.child.try_wait().map_err(|e| CliError::Io("waiting for QEMU".into(), e))?.is_none() {
            let m = merge_guest(vm.child.id()).and_then(|m| match get(vm.port) {
                Some(_) => Ok(m),
                None => Err(usage("the guest's service stopped answering after its RAM was merged".into())),
            })?;
            if args.json {
                event("merged", m);
            } else {
                let _ = crate::write_out(format_args!("merged: {m}\n"));
            }
        }
    }
    if args.exit_when_ready {
        drop(signals);
        vm.stop();
        return Ok(true);
    }
    let status = vm.wait()?;
    drop(signals);
    if !args.json {
        eprintln!("advm vm run: QEMU exited ({status})");
    }
    // Stopped on request (Ctrl-C, SIGTERM, SIGHUP), QEMU exits 0, and so does advm. It
    // said nothing when QEMU failed or was killed later (its status was only printed):
    // a script or a supervisor saw success.
    if !status.success() && advm::process::ForwardSignals::last_received().is_none() {
        return Err(usage(format!(
            "QEMU exited ({status}) after the guest's service had answered\nQEMU said:\n{}\nconsole tail:\n{}{}",
            tail(&vm.qemu_log, 10),
            tail(&vm.console, 20),
            vm.hint()
        )));
    }
    Ok(status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(env: &'a [(&str, String)], k: &str) -> Option<&'a str> {
        env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str())
    }

    /// A user refused /dev/kvm by its permissions is told so and which group grants
    /// it, not that KVM needs hardware virtualisation.
    #[test]
    fn a_user_refused_dev_kvm_is_told_about_its_permissions() {
        let dir = std::env::temp_dir().join(format!("advm-test-kvm-perm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dev = dir.join("kvm");
        std::fs::write(&dev, b"").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dev, std::fs::Permissions::from_mode(0o600)).unwrap();
        let refused = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let why = kvm_open_failure(&refused, &dev);
        assert!(why.contains("may not use KVM") && why.contains("mode 600") && why.contains("group"), "{why}");
        assert!(!why.contains("hardware"), "{why}");
        std::fs::set_permissions(&dev, std::fs::Permissions::from_mode(0o660)).unwrap();
        assert!(kvm_open_failure(&refused, &dev).contains("add the user to group"));
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert!(kvm_open_failure(&missing, &dev).contains("hardware virtualisation"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_guest_out_of_memory_or_given_too_little_gets_a_hint_naming_mem() {
        let panic = "[    6.09] Out of memory: Killed process 103 (insmod)\n[    6.20] Kernel panic - not syncing: System is deadlocked on memory";
        let h = memory_hint(panic, 96, 0).unwrap();
        assert!(h.contains("ran out of memory with --mem 96") && h.contains("at least 112 MiB;"), "{h}");
        // Out of memory said by a guest with plenty: still the reason.
        assert!(memory_hint(panic, 4096, 0).unwrap().contains("ran out of memory"));
        // Nothing printed and too little memory: the kernel may not have unpacked itself.
        assert!(memory_hint("", 64, 512 << 20).unwrap().contains("needs, 112 MiB (below"));
        // A guest given enough that failed for another reason: no hint.
        assert_eq!(memory_hint("advm-init: root /dev/vda mounted with -o ro", 256, 512 << 20), None);
        // A large pmem device's page structures take guest RAM: a 16 GiB disk under a
        // 160 MiB guest ran out of memory while booting, and the hint said 112 MiB.
        let h = memory_hint(panic, 360, 16 << 30).unwrap();
        assert!(h.contains("at least 360 MiB with this disk: 112, and 248 MiB more for the page structures"), "{h}");
        assert!(h.contains("16384 MiB pmem device") && h.contains("--disk blk"), "{h}");
        assert!(memory_hint("", 300, 16 << 30).unwrap().contains("--mem 300 is below"));
        assert_eq!(pmem_page_structs_mib(1 << 40), 16 << 10);
        assert_eq!(pmem_page_structs_mib(512 << 20), BUILT_PAGE_STRUCTS_MIB);
    }

    #[test]
    fn merge_preloads_the_agent_beside_the_shim_for_guest_ram_and_qemus_blocks_and_never_on_its_own() {
        let (shim, agent) = (Path::new("/l/libadvm_preload.so"), Path::new("/l/libadvm.so"));
        let env = preload_env(Some(shim), Some(agent), MergeScope::Ram.min_bytes(128));
        assert_eq!(get(&env, "LD_PRELOAD"), Some("/l/libadvm_preload.so:/l/libadvm.so"));
        assert_eq!(get(&env, advm_preload::env::MODE), Some("off"));
        assert_eq!(get(&env, advm::merge::agent::ENV_AGENT), Some("1"));
        // `--merge-scope ram`: mappings below the guest's 128 MiB (QEMU's heap, its
        // arenas, its kernel copy) stay as they are.
        assert_eq!(get(&env, advm::merge::agent::ENV_MIN_BYTES), Some("134217728"));
        // `qemu` (the default): QEMU's blocks of 2 MiB and more too, whatever the guest's size.
        for mem in [128, 4096] {
            let env = preload_env(Some(shim), Some(agent), MergeScope::Qemu.min_bytes(mem));
            assert_eq!(get(&env, advm::merge::agent::ENV_MIN_BYTES), Some("2097152"));
        }
        let growth: u64 = get(&env, advm::merge::agent::ENV_MIN_GROWTH).unwrap().parse().unwrap();
        assert!(growth >= 1 << 50, "the agent would merge by itself after {growth} bytes of growth");
        // blk: the agent alone; no merge: no agent.
        let env = preload_env(None, Some(agent), 256);
        assert_eq!(get(&env, "LD_PRELOAD"), Some("/l/libadvm.so"));
        assert_eq!(get(&env, advm_preload::env::MODE), None);
        let env = preload_env(Some(shim), None, 256);
        assert_eq!(get(&env, "LD_PRELOAD"), Some("/l/libadvm_preload.so"));
        assert_eq!(get(&env, advm::merge::agent::ENV_AGENT), None);
        assert!(preload_env(None, None, 256).is_empty());
    }
}
