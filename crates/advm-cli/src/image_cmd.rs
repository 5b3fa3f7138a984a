//! `advm image info|map|cat`: a qcow2 chain's layers, its extent map, and bytes read
//! through the mapping.

use std::io::Write;
use std::path::PathBuf;

use advm::image::{ExtentKind, GuestOffset, Image, ImageOptions, ImageSpace, MapOptions, OverBudget};

use crate::{to_json, CliError};
use advm_bench::render_cells;

/// What a backing chain may lead to (see docs/image.md).
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct ChainArgs {
    /// Follow backing files outside the directory tree of the image (absolute names,
    /// `..`, symlinks leading out).
    #[arg(long)]
    allow_backing_outside: bool,
    /// Read a backing file that has no backing format and is not qcow2 as raw.
    #[arg(long)]
    allow_probed_raw: bool,
    /// Read layers another process (a running QEMU) holds open for writing, as
    /// `qemu-img -U`; the disk may change while it is read.
    #[arg(short = 'U', long)]
    force_share: bool,
}

impl ChainArgs {
    /// The library's options for these flags.
    pub fn options(self) -> ImageOptions {
        ImageOptions {
            allow_backing_outside: self.allow_backing_outside,
            allow_probed_raw: self.allow_probed_raw,
            force_share: self.force_share,
        }
    }
}

/// `advm image ...`.
#[derive(Debug, clap::Subcommand)]
pub enum ImageCmd {
    /// The layers of the backing chain: format, sizes, cluster size, backing names.
    Info {
        /// The image (qcow2 or raw).
        image: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        chain: ChainArgs,
    },
    /// The extent map: per run of the virtual disk, where its bytes come from.
    Map {
        /// The image.
        image: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        chain: ChainArgs,
    },
    /// Writes bytes of the virtual disk to stdout, read through the mapping.
    Cat {
        /// The image.
        image: PathBuf,
        /// First byte.
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Number of bytes (default: to the end of the disk).
        #[arg(long)]
        length: Option<u64>,
        /// Read small runs into memory when the image needs more mappings than the
        /// VMA budget allows (default: fail).
        #[arg(long)]
        copy_over_budget: bool,
        /// Most bytes to decompress or copy into memory for the mapping (default 256 MiB).
        #[arg(long, value_name = "BYTES")]
        max_materialised: Option<u64>,
        #[command(flatten)]
        chain: ChainArgs,
    },
}

/// Runs an `advm image` command.
pub fn run(cmd: ImageCmd) -> Result<(), CliError> {
    match cmd {
        ImageCmd::Info { image, json, chain } => {
            let img = Image::open_with(&image, &chain.options())?;
            let info = img.info();
            if json {
                outln!("{}", to_json(&serde_json::json!({ "virtual_size_bytes": img.virtual_size(), "layers": info })));
                return Ok(());
            }
            let mut cells =
                vec![["depth", "file", "format", "virtual size", "file size", "cluster", "backing", "notes"]
                    .map(String::from)
                    .to_vec()];
            for l in &info {
                let mut notes = Vec::new();
                if l.crypt_method != 0 {
                    notes.push(format!("encrypted (method {})", l.crypt_method));
                }
                if let Some(c) = l.compression {
                    if c != advm::image::Compression::Deflate {
                        notes.push(format!("{c:?} compression"));
                    }
                }
                if l.extended_l2 {
                    notes.push("extended L2".into());
                }
                if let Some(d) = &l.data_file {
                    notes.push(format!("data file {}{}", d.display(), if l.data_file_raw { " (raw)" } else { "" }));
                }
                cells.push(vec![
                    l.depth.to_string(),
                    l.path.display().to_string(),
                    format!("{:?}", l.format).to_lowercase(),
                    l.virtual_size_bytes.to_string(),
                    l.file_size_bytes.to_string(),
                    l.cluster_size_bytes.map_or("-".into(), |c| c.to_string()),
                    match (&l.backing_name, &l.backing_format) {
                        (Some(n), Some(f)) => format!("{n} ({f})"),
                        (Some(n), None) => n.clone(),
                        _ => "-".into(),
                    },
                    notes.join(", "),
                ]);
            }
            out!("{}", render_cells(&cells));
        }
        ImageCmd::Map { image, json, chain } => {
            let img = Image::open_with(&image, &chain.options())?;
            let map = img.extent_map()?;
            let files: Vec<String> = img.layers().iter().map(|l| l.path().display().to_string()).collect();
            // Data extents' offsets are in a layer's external data file when it has one.
            let data_files: Vec<String> =
                img.layers().iter().map(|l| l.data_file().unwrap_or(l.path()).display().to_string()).collect();
            let file_of = |e: &advm::image::Extent| match e.kind {
                ExtentKind::Data { .. } => &data_files[e.depth],
                _ => &files[e.depth],
            };
            if json {
                let extents: Vec<serde_json::Value> = map
                    .extents
                    .iter()
                    .map(|e| {
                        let mut v = serde_json::to_value(e).expect("extents serialize");
                        v["file"] = serde_json::json!(file_of(e));
                        v
                    })
                    .collect();
                outln!("{}", to_json(&serde_json::json!({ "virtual_size_bytes": map.size, "extents": extents })));
                return Ok(());
            }
            let mut cells = vec![["start", "length", "kind", "depth", "file", "offset"].map(String::from).to_vec()];
            for e in &map.extents {
                let (kind, offset) = match &e.kind {
                    ExtentKind::Data { offset } => ("data".to_string(), offset.to_string()),
                    ExtentKind::Zero { reason } => (format!("zero ({reason})"), "-".into()),
                    ExtentKind::Compressed { offset, .. } => ("compressed".into(), offset.to_string()),
                    ExtentKind::Unsupported { reason } => (format!("unsupported: {reason}"), "-".into()),
                    _ => ("other".into(), "-".into()),
                };
                cells.push(vec![
                    e.start.to_string(),
                    e.len.to_string(),
                    kind,
                    e.depth.to_string(),
                    file_of(e).clone(),
                    offset,
                ]);
            }
            out!("{}", render_cells(&cells));
        }
        ImageCmd::Cat { image, offset, length, copy_over_budget, max_materialised, chain } => {
            let options = MapOptions {
                over_budget: if copy_over_budget { OverBudget::CopySmallRuns } else { OverBudget::Fail },
                max_materialised_bytes: max_materialised,
                image: chain.options(),
                ..Default::default()
            };
            let opened = Image::open_with(&image, &options.image)?;
            let size = opened.virtual_size();
            let length = length.unwrap_or(size.saturating_sub(offset));
            if offset.checked_add(length).map_or(true, |end| end > size) {
                return Err(CliError::Usage(format!(
                    "--offset {offset} --length {length} runs past the {size}-byte virtual size of {}",
                    image.display()
                )));
            }
            if length == 0 {
                // Nothing to write (a size-0 image, which cannot be mapped, among them).
                return Ok(());
            }
            let space = ImageSpace::map_image(&opened, &options)?;
            let mut out = std::io::stdout().lock();
            let mut buf = vec![0u8; 1 << 20];
            let mut at = offset;
            while at < offset + length {
                let n = buf.len().min((offset + length - at) as usize);
                // Checks, before each chunk, that no layer shrank or is being written.
                space.read(GuestOffset(at), &mut buf[..n])?;
                out.write_all(&buf[..n]).map_err(crate::stdout_error)?;
                at += n as u64;
            }
            out.flush().map_err(crate::stdout_error)?;
        }
    }
    Ok(())
}
