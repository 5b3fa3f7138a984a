//! The QEMU command line of `advm vm run`: a pure function of the settings, so tests
//! check it without starting anything.

use std::path::PathBuf;

/// How the guest sees its disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disk {
    /// virtio-pmem over a memory backend whose file is advm's plan (`backing`), of
    /// `size` bytes; the guest mounts it with `-o dax`. `reserve`: QEMU reserves commit
    /// (swap space) for the whole device when it maps it; without, `reserve=off`
    /// (`MAP_NORESERVE`, kept by the shim for every piece of the plan).
    Pmem { backing: String, size: u64, reserve: bool },
    /// QEMU's own driver for the top layer's `format` (`qcow2` or `raw`) on virtio-blk;
    /// writes go to a temporary overlay (`snapshot=on`), never into the chain.
    /// `force_share` (`-U`): QEMU opens the image even while a writer holds it.
    /// `data_files`: (depth, absolute path) of each layer's external data file, named
    /// to QEMU, which looks for a relative name in its working directory.
    Blk { image: PathBuf, format: &'static str, force_share: bool, data_files: Vec<(usize, PathBuf)> },
}

/// How QEMU runs the guest's CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Accel {
    /// Hardware virtualisation through /dev/kvm.
    Kvm,
    /// QEMU's emulator: slower, but boots any kernel anywhere.
    Tcg,
}

/// Everything the command line depends on.
#[derive(Debug, Clone)]
pub struct Settings {
    pub qemu: String,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub disk: Disk,
    pub mem_mib: u64,
    pub accel: Accel,
    /// The emulator's translation buffer, MiB (tcg only).
    pub tb_mib: u64,
    /// Guest RAM mergeable (QEMU's `mem-merge`), for KSM.
    pub ksm: bool,
    /// The guest without address-space randomisation ([`NO_ASLR`]).
    pub no_aslr: bool,
    /// The guest's service keeps writing files (`advm.writes=1`; the root is read-write
    /// only then).
    pub guest_writes: bool,
    /// Host port forwarded to the guest's service (port 8000).
    pub port: u16,
    /// Where the serial console goes.
    pub console: PathBuf,
    pub extra: Vec<String>,
}

/// The guest's service port.
pub const GUEST_PORT: u16 = 8000;

/// Free page reporting: the guest tells QEMU which of its pages are free and QEMU
/// drops them from the host (`MADV_DONTNEED`), so a VM holds what its guest uses rather
/// than everything it ever touched. Under every disk method alike.
pub const BALLOON: &str = "virtio-balloon-pci,free-page-reporting=on";

/// Kernel command line of `--no-aslr`: the kernel and its modules (`nokaslr`), every
/// process's mappings (`norandmaps`) and Python's hashes (`PYTHONHASHSEED=0`, handed to
/// init as an environment variable) are laid out alike in every guest, so more of
/// their memory is equal across VMs for `--merge` and `--ksm`. Measured (docs/vm.md):
/// a second merged VM found 7940 of its pages in the first's store with randomisation,
/// 11748 with `nokaslr`, 13097 with `norandmaps` too, 13876 with all three.
pub const NO_ASLR: &str = "nokaslr norandmaps PYTHONHASHSEED=0";

/// QEMU options that `advm vm run` gives itself, each with what to use instead. Given
/// again after `--`, QEMU merges or overrides them and the VM breaks in ways that do
/// not name the cause: another `-m` keeps advm's `maxmem` and leaves no room for the
/// pmem device ("not enough space ... for memory devices"), another `-append` drops
/// `advm.root` and the initramfs mounts the wrong disk, another `-kernel` or `-accel`
/// quietly wins or loses against advm's.
const OWN_OPTIONS: [(&str, &str); 8] = [
    ("-m", "--mem"),
    ("-kernel", "--kernel"),
    ("-initrd", "--initrd"),
    ("-append", "nothing: the guest's command line is advm's (advm.root, the console; see docs/vm.md)"),
    ("-accel", "--accel"),
    ("-enable-kvm", "--accel kvm"),
    ("-machine", "--accel and --ksm"),
    ("-M", "--accel and --ksm"),
];

/// Refuses extra arguments (after `--`) that repeat an option advm sets itself
/// ([`OWN_OPTIONS`]); QEMU takes `--opt` for `-opt`. The message names the option and
/// what to use instead.
pub fn check_extra(extra: &[String]) -> Result<(), String> {
    for a in extra {
        let opt = a.strip_prefix('-').unwrap_or(a);
        if let Some((own, instead)) = OWN_OPTIONS.iter().find(|(o, _)| *a == *o || opt == *o) {
            return Err(format!(
                "extra QEMU argument {a}: advm vm run sets {own} itself (given twice, QEMU merges or overrides it \
                 and the VM breaks without saying why); use {instead}"
            ));
        }
    }
    Ok(())
}

/// The arguments after the program name.
pub fn args(s: &Settings) -> Vec<String> {
    let root = match s.disk {
        Disk::Pmem { .. } => "pmem",
        Disk::Blk { .. } => "blk",
    };
    // The emulator's translation buffer defaults to 1 GiB of anonymous memory per VM,
    // filled as the guest runs new code: an emulation cost KVM does not have, bounded so
    // it weighs the same, and little, under every disk method.
    let (accel, cpu) = match s.accel {
        Accel::Kvm => ("kvm".to_string(), "host"),
        Accel::Tcg => (format!("tcg,tb-size={}", s.tb_mib), "max"),
    };
    // no_timer_check: an emulated guest on a busy host can miss the IO-APIC timer check
    // and panic. swiotlb=noforce: with a hotplug area (the pmem device's) the guest sees
    // memory above 4 GiB and would zero a 64 MiB bounce buffer no virtio device needs.
    // page_reporting_order=0: the guest reports free pages of every size to the balloon
    // (by default only free 2 MiB blocks, rare in a small guest), so what it touched while
    // booting and freed goes back to the host; the same for every disk method.
    let mut a: Vec<String> = vec![
        "-machine".into(),
        format!("pc,mem-merge={}", if s.ksm { "on" } else { "off" }),
        "-accel".into(),
        accel,
        "-cpu".into(),
        cpu.into(),
        "-smp".into(),
        "1".into(),
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-display".into(),
        "none".into(),
        "-no-reboot".into(),
        "-serial".into(),
        format!("file:{}", s.console.display()),
        "-kernel".into(),
        s.kernel.display().to_string(),
        "-initrd".into(),
        s.initrd.display().to_string(),
        "-append".into(),
        format!(
            "console=ttyS0 quiet panic=-1 no_timer_check swiotlb=noforce page_reporting.page_reporting_order=0 \
             advm.root={root}{}{}",
            if s.guest_writes { " advm.writes=1" } else { "" },
            if s.no_aslr { format!(" {NO_ASLR}") } else { String::new() }
        ),
        "-netdev".into(),
        format!("user,id=net0,hostfwd=tcp:127.0.0.1:{}-:{GUEST_PORT}", s.port),
        "-device".into(),
        "virtio-net-pci,netdev=net0,romfile=".into(),
        "-device".into(),
        BALLOON.into(),
    ];
    match &s.disk {
        Disk::Pmem { backing, size, reserve } => {
            // The device sits in the hotplug area above RAM: room for it, and a slot.
            let max = s.mem_mib + size.div_ceil(1 << 20);
            a.extend([
                "-m".into(),
                format!("{}M,slots=1,maxmem={max}M", s.mem_mib),
                "-object".into(),
                format!(
                    "memory-backend-file,id=pmem0mem,mem-path={backing},size={size},share=off{}",
                    if *reserve { "" } else { ",reserve=off" }
                ),
                "-device".into(),
                "virtio-pmem-pci,memdev=pmem0mem,id=pmem0".into(),
            ]);
        }
        Disk::Blk { image, format, force_share, data_files } => {
            // QEMU splits option values at commas; a comma in a path is written twice.
            let escape = |p: &PathBuf| p.display().to_string().replace(',', ",,");
            let file = escape(image);
            // A layer's data file by the path advm resolved (beside the layer), as an
            // option of that layer's node: `backing.` once per depth.
            let data: String = data_files
                .iter()
                .map(|(depth, path)| format!(",{}data-file.filename={}", "backing.".repeat(*depth), escape(path)))
                .collect();
            a.extend([
                "-m".into(),
                format!("{}M", s.mem_mib),
                "-drive".into(),
                format!(
                    "file={file},if=none,id=disk0,format={format},snapshot=on{}{data}",
                    if *force_share { ",force-share=on" } else { "" }
                ),
                "-device".into(),
                "virtio-blk-pci,drive=disk0".into(),
            ]);
        }
    }
    a.extend(s.extra.iter().cloned());
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(disk: Disk) -> Settings {
        Settings {
            qemu: "qemu-system-x86_64".into(),
            kernel: "/g/vmlinuz".into(),
            initrd: "/g/initrd.img".into(),
            disk,
            mem_mib: 256,
            accel: Accel::Kvm,
            tb_mib: 24,
            ksm: false,
            no_aslr: false,
            guest_writes: false,
            port: 4321,
            console: "/run/c.log".into(),
            extra: vec!["-S".into()],
        }
    }

    fn has(a: &[String], flag: &str, value: &str) -> bool {
        a.windows(2).any(|w| w[0] == flag && w[1] == value)
    }

    #[test]
    fn pmem_disk_is_a_virtio_pmem_device_over_the_plan_file_with_room_above_ram() {
        let a = args(&settings(Disk::Pmem { backing: "/proc/self/fd/7".into(), size: 1 << 30, reserve: false }));
        assert!(has(
            &a,
            "-object",
            "memory-backend-file,id=pmem0mem,mem-path=/proc/self/fd/7,size=1073741824,share=off,reserve=off"
        ));
        let reserved = args(&settings(Disk::Pmem { backing: "/proc/self/fd/7".into(), size: 1 << 30, reserve: true }));
        assert!(reserved.iter().any(|x| x.ends_with("size=1073741824,share=off")), "{reserved:?}");
        assert!(has(&a, "-device", "virtio-pmem-pci,memdev=pmem0mem,id=pmem0"));
        assert!(has(&a, "-m", "256M,slots=1,maxmem=1280M"));
        assert!(has(&a, "-append", "console=ttyS0 quiet panic=-1 no_timer_check swiotlb=noforce page_reporting.page_reporting_order=0 advm.root=pmem"));
        assert!(!a.iter().any(|x| x.starts_with("file=")), "no block device in pmem mode: {a:?}");
    }

    #[test]
    fn blk_disk_is_qemus_qcow2_driver_writing_to_a_temporary_overlay() {
        let a = args(&settings(Disk::Blk {
            image: "/g/app.qcow2".into(),
            format: "qcow2",
            force_share: false,
            data_files: vec![],
        }));
        assert!(has(&a, "-drive", "file=/g/app.qcow2,if=none,id=disk0,format=qcow2,snapshot=on"));
        // External data files by the path advm resolved, on their layer's node.
        let a = args(&settings(Disk::Blk {
            image: "/g/app.qcow2".into(),
            format: "qcow2",
            force_share: false,
            data_files: vec![(0, "/g/app.data".into()), (2, "/g/b,1.data".into())],
        }));
        assert!(
            has(
                &a,
                "-drive",
                "file=/g/app.qcow2,if=none,id=disk0,format=qcow2,snapshot=on,data-file.filename=/g/app.data,\
                 backing.backing.data-file.filename=/g/b,,1.data"
            ),
            "{a:?}"
        );
        assert!(has(&a, "-append", "console=ttyS0 quiet panic=-1 no_timer_check swiotlb=noforce page_reporting.page_reporting_order=0 advm.root=blk"));
        assert!(has(&a, "-m", "256M"));
        // A raw top is read as raw; a comma in the path is escaped, not an option separator.
        let a = args(&settings(Disk::Blk {
            image: "/g/vm,1/disk.raw".into(),
            format: "raw",
            force_share: false,
            data_files: vec![],
        }));
        assert!(has(&a, "-drive", "file=/g/vm,,1/disk.raw,if=none,id=disk0,format=raw,snapshot=on"), "{a:?}");
        // -U: QEMU, too, opens the image while a writer holds it (it refused before:
        // 'Failed to get shared "write" lock').
        let a =
            args(&settings(Disk::Blk { image: "/g/a".into(), format: "qcow2", force_share: true, data_files: vec![] }));
        assert!(has(&a, "-drive", "file=/g/a,if=none,id=disk0,format=qcow2,snapshot=on,force-share=on"), "{a:?}");
    }

    #[test]
    fn ksm_turns_qemus_mem_merge_on_and_extra_args_come_last() {
        let mut s = settings(Disk::Blk {
            image: "/g/app.qcow2".into(),
            format: "qcow2",
            force_share: false,
            data_files: vec![],
        });
        assert!(has(&args(&s), "-machine", "pc,mem-merge=off") && has(&args(&s), "-accel", "kvm"));
        s.ksm = true;
        let a = args(&s);
        assert!(has(&a, "-machine", "pc,mem-merge=on"));
        s.accel = Accel::Tcg;
        let a = args(&s);
        assert!(has(&a, "-accel", "tcg,tb-size=24") && has(&a, "-cpu", "max"));
        assert!(has(&a, "-netdev", "user,id=net0,hostfwd=tcp:127.0.0.1:4321-:8000"));
        assert_eq!(a.last().map(String::as_str), Some("-S"));
    }

    #[test]
    fn extra_arguments_may_not_repeat_advms_own_options() {
        let extra = |a: &[&str]| check_extra(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            extra(&["-qmp", "unix:/tmp/q,server=on,wait=off", "-smp", "2", "-device", "virtio-rng-pci"]),
            Ok(())
        );
        let e = extra(&["-S", "-m", "512"]).unwrap_err();
        assert!(e.contains("extra QEMU argument -m") && e.contains("use --mem"), "{e}");
        assert!(extra(&["--m", "512"]).unwrap_err().contains("use --mem"));
        assert!(extra(&["-append", "quiet"]).unwrap_err().contains("advm.root"));
        assert!(extra(&["-enable-kvm"]).unwrap_err().contains("--accel kvm"));
        // option values are not options
        assert_eq!(extra(&["-name", "m"]), Ok(()));
    }

    #[test]
    fn every_disk_method_has_a_balloon_reporting_free_pages_and_a_guest_reporting_small_ones() {
        let disks = [
            Disk::Pmem { backing: "/proc/self/fd/7".into(), size: 1 << 30, reserve: false },
            Disk::Blk { image: "/g/a".into(), format: "qcow2", force_share: false, data_files: vec![] },
        ];
        for disk in disks {
            for ksm in [false, true] {
                let mut s = settings(disk.clone());
                s.ksm = ksm;
                let a = args(&s);
                assert!(has(&a, "-device", "virtio-balloon-pci,free-page-reporting=on"), "{a:?}");
                let append = a.windows(2).find(|w| w[0] == "-append").map(|w| w[1].clone()).unwrap();
                assert!(append.split(' ').any(|o| o == "page_reporting.page_reporting_order=0"), "{append}");
            }
        }
    }

    #[test]
    fn no_aslr_lays_the_guest_out_alike_and_is_off_by_default() {
        let mut s =
            settings(Disk::Blk { image: "/g/a".into(), format: "qcow2", force_share: false, data_files: vec![] });
        let append = |s: &Settings| args(s).windows(2).find(|w| w[0] == "-append").map(|w| w[1].clone()).unwrap();
        let opts = ["nokaslr", "norandmaps", "PYTHONHASHSEED=0"];
        let off = append(&s);
        assert!(opts.iter().all(|o| !off.split(' ').any(|x| x == *o)), "{off}");
        s.no_aslr = true;
        let on = append(&s);
        assert!(opts.iter().all(|o| on.split(' ').any(|x| x == *o)), "{on}");
    }
}
