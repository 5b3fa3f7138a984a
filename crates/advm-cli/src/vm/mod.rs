//! `advm vm`: FlexMem end to end with unmodified QEMU. `image build` makes a Debian
//! guest as a two-layer qcow2 chain, `run` boots it with the chain as a DAX pmem device
//! backed by advm's image mapping (or as QEMU's own virtio-blk disk, the baseline).
//! See docs/vm.md.

mod build;
mod dump;
mod qemu;
mod run;

use std::path::PathBuf;

use crate::CliError;

/// `advm vm ...`
#[derive(Debug, clap::Subcommand)]
pub enum VmCmd {
    /// Guest images.
    #[command(subcommand)]
    Image(ImageCmd),
    /// Boot a guest from a qcow2 chain under QEMU/KVM; prints `ready` when its service answers.
    Run(run::RunArgs),
    /// Write the pages a running `--disk pmem` VM has written to a new qcow2 overlay over
    /// its chain's top, while it runs.
    Dump {
        /// The `advm vm run` process (its pid, as `advm vm run` prints it).
        #[arg(long)]
        vm: u32,
        /// The overlay to create.
        #[arg(long)]
        out: PathBuf,
        /// Seconds to wait for the copy.
        #[arg(long, default_value_t = 120)]
        timeout: u64,
        /// One JSON object on stdout instead of the text lines.
        #[arg(long)]
        json: bool,
    },
}

/// `advm vm image ...`
#[derive(Debug, clap::Subcommand)]
pub enum ImageCmd {
    /// Build (once; cached) a kernel, an initramfs and a Debian root as base.qcow2 with an
    /// application layer app.qcow2 on top.
    Build {
        /// Where to build and cache (default: ~/.cache/advm/vm).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Debian mirror for debootstrap.
        #[arg(long, default_value = "http://deb.debian.org/debian")]
        mirror: String,
    },
}

/// The default guest directory: `$XDG_CACHE_HOME/advm/vm` or `~/.cache/advm/vm`.
pub fn default_dir() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"));
    cache.join("advm").join("vm")
}

/// Runs `advm vm ...`.
pub fn run(cmd: VmCmd) -> Result<(), CliError> {
    match cmd {
        VmCmd::Image(ImageCmd::Build { out, mirror }) => {
            let dir = out.unwrap_or_else(default_dir);
            let built = build::build(&dir, &mirror)?;
            outln!("{}", built.app.display());
            Ok(())
        }
        VmCmd::Run(args) => run::run(args),
        VmCmd::Dump { vm, out, timeout, json } => dump::run(vm, &out, std::time::Duration::from_secs(timeout), json),
    }
}
