//! Opening a chain: each layer file (type checks, format sniffing), and the policy on
//! which backing files a header may name ([`ImageOptions`]).

use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::qcow2;
use super::{Compression, LayerFormat, LayerOffset};
use crate::{Error, Result};

/// The most layers a chain may have (qemu has no fixed limit; this stops runaway
/// chains built by mistake).
pub const MAX_CHAIN_DEPTH: usize = 64;

#[derive(Debug)]
pub(super) enum Driver {
    Qcow2(qcow2::Qcow2),
    Raw,
}

/// What [`Image::open_with`] may follow. The defaults are what a careful VMM does with
/// an image it did not write itself: a header names files, and advm often runs as root.
#[derive(Debug, Clone, Copy, Default)]
pub struct ImageOptions {
    /// Follow backing files outside the directory tree of the image opened (an
    /// absolute name, `..`, or a symlink leading out). Default: refused.
    pub allow_backing_outside: bool,
    /// Read a backing file that has no backing-format extension and no qcow2 magic as
    /// raw. Default: refused (qemu requires the format for the same reason: probing
    /// turns any file a header names into disk contents).
    pub allow_probed_raw: bool,
    /// Read layers that another process (a running QEMU) holds open for writing, as
    /// `qemu-img -U` does. Default: refused, since the disk may change under the
    /// reader and its metadata may be half written.
    pub force_share: bool,
}

/// The byte of an image file on which QEMU holds a shared OFD lock while it has the
/// image open with write permission (its lock bytes start at 100, one per permission
/// bit; writing is bit 1).
const QEMU_WRITE_LOCK_BYTE: i64 = 101;

/// The byte on which QEMU holds a shared OFD lock while it has an image open and lets
/// nobody else write to it (its "unshared permission" bytes start at 200; writing is
/// bit 1). A QEMU, qemu-img or qemu-io opening the file for writing tests it and
/// refuses: `Failed to get "write" lock`.
const QEMU_NO_WRITERS_BYTE: i64 = 201;

/// Refuses `layer` when another process holds QEMU's write lock on it, unless
/// `options.force_share`. Filesystems without OFD locks cannot tell; they pass.
fn refuse_writer(layer: &Layer, options: &ImageOptions) -> Result<()> {
    if options.force_share {
        return Ok(());
    }
    refuse_writer_of(&layer.path, &layer.file)
}

fn refuse_writer_of(path: &Path, file: &File) -> Result<()> {
    let err = |why: String| Error::Image { path: path.to_path_buf(), why };
    let locked = crate::sys::fs::layer::byte_locked_by_other(file, QEMU_WRITE_LOCK_BYTE)
        .map_err(|e| err(format!("checking for a writer's lock: {e}")))?;
    if locked == Some(true) {
        let shown = path.display();
        return Err(err(format!(
            "another process has it open for writing (it holds QEMU's write lock, byte {QEMU_WRITE_LOCK_BYTE} \
             of the file), so the disk may change while it is read; refusing to read it (stop the writer, \
             which `fuser {shown}` names, or read anyway with --force-share/-U, ImageOptions::force_share)"
        )));
    }
    Ok(())
}

/// A new open file description of the layer `file` (at `path`) holding QEMU's
/// no-writers lock for as long as it, or a duplicate of it (a VMM's inherited
/// descriptor), stays open: while the layer is mapped, QEMU and qemu-img refuse to open
/// it for writing, as they do while a QEMU reads it as a backing file. Without it a
/// writer was refused only at open ([`Image::open_with`]), and one starting later was
/// seen only through a read lease, which a VMM's plan does not hold. The writer's lock
/// is tested again once this one is held, so a writer that got in after the open is
/// refused now (QEMU, too, takes its own locks before testing the others': one of the
/// two always sees the other). With `force_share` (read while written, `-U`) a plain
/// reopen. `None` when the file cannot be reopened (its description may be another
/// process's, a daemon's, so no lock goes on it); no lock either where the filesystem
/// keeps none.
pub(crate) fn hold_off_writers(path: &Path, file: &File, force_share: bool) -> Result<Option<File>> {
    use crate::sys::fs::layer;
    let Ok(own) = layer::reopen_read(file) else { return Ok(None) };
    if !force_share {
        layer::lock_byte_shared(&own, QEMU_NO_WRITERS_BYTE)
            .map_err(|e| Error::Image { path: path.to_path_buf(), why: format!("locking out writers: {e}") })?;
        refuse_writer_of(path, &own)?;
    }
    Ok(Some(own))
}

/// A layer file's identity and version through its open descriptor, for
/// [`LayerStamp::changed_in_place`]. A block device's node keeps its times while the
/// disk is written through another node (another name, a partition's parent): its
/// version is also the kernel's count of sectors written to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerStamp {
    /// Device of the file.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time: seconds and nanoseconds.
    pub mtime: (i64, i64),
    /// Status change time: seconds and nanoseconds (nobody can set it back).
    pub ctime: (i64, i64),
    /// Hard links to the file.
    pub nlink: u64,
    /// For a block device, the sectors written to it since it appeared (its
    /// `/sys/dev/block/MAJ:MIN/stat`), its dirty pages written back first so that
    /// bytes written and not yet flushed count; `None` for a file, or when sysfs does
    /// not say.
    pub sectors_written: Option<u64>,
}

impl LayerStamp {
    /// Whether the file's contents may have changed between `self` and `now` (stamps
    /// of one open layer): its size or mtime moved, or its ctime did with its link
    /// count as it was (a write whose mtime was put back, `touch -d`, `cp -p`; or an
    /// attribute change, which cannot be told apart). A ctime moved by a link count
    /// that changed is the name going (`mv` of another file over it, `rm`): the open
    /// layer, and what was mapped from it, still reads the old file.
    /// For a block device: sectors were written to it (by anyone, through any node of
    /// it; writes to another partition of its disk, or to a file under a loop device,
    /// are not counted).
    pub fn changed_in_place(&self, now: &LayerStamp) -> bool {
        self.size != now.size
            || self.mtime != now.mtime
            || (self.ctime != now.ctime && self.nlink == now.nlink)
            || self.sectors_written != now.sectors_written
    }
}

/// One layer of a chain: its file, opened read-only, and what its header says.
#[derive(Debug)]
pub struct Layer {
    pub(super) path: PathBuf,
    pub(super) file: File,
    pub(super) file_len: u64,
    pub(super) driver: Driver,
    /// The external data file a qcow2 layer keeps its guest clusters in; its data
    /// extents' offsets are offsets in it.
    pub(super) data: Option<DataFile>,
}

/// An external data file (qcow2 incompatible bit 2), opened read-only.
#[derive(Debug)]
pub(super) struct DataFile {
    pub(super) path: PathBuf,
    pub(super) file: File,
    pub(super) len: u64,
}

/// What `advm image info` shows about a layer.
#[derive(Debug, Clone, Serialize)]
pub struct LayerInfo {
    /// Depth in the chain (0 = the image opened).
    pub depth: usize,
    /// The layer file.
    pub path: PathBuf,
    /// Its format.
    pub format: LayerFormat,
    /// Its virtual size in bytes.
    pub virtual_size_bytes: u64,
    /// Its file size in bytes.
    pub file_size_bytes: u64,
    /// qcow2 cluster size in bytes.
    pub cluster_size_bytes: Option<u64>,
    /// qcow2 version.
    pub version: Option<u32>,
    /// The backing file name as written in the header.
    pub backing_name: Option<String>,
    /// The backing format extension, when present.
    pub backing_format: Option<String>,
    /// The external data file the layer's guest clusters are in (a relative name
    /// resolved beside the layer file), when it has one.
    pub data_file: Option<PathBuf>,
    /// The data file reads as a raw image by itself (`data_file_raw`).
    pub data_file_raw: bool,
    /// Encryption method (0 none, 1 AES, 2 LUKS).
    pub crypt_method: u32,
    /// Compression of compressed clusters.
    pub compression: Option<Compression>,
    /// Extended L2 entries (subclusters).
    pub extended_l2: bool,
    /// Incompatible feature bits.
    pub incompatible_features: u64,
}

impl Layer {
    /// The layer file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The layer's format.
    pub fn format(&self) -> LayerFormat {
        match self.driver {
            Driver::Qcow2(_) => LayerFormat::Qcow2,
            Driver::Raw => LayerFormat::Raw,
        }
    }

    /// Its virtual size.
    pub fn virtual_size(&self) -> u64 {
        match &self.driver {
            Driver::Qcow2(q) => q.size,
            // QEMU counts a raw disk in whole 512-byte sectors, the last one padded
            // with zeros (a file of 70,001 bytes is a disk of 70,144).
            Driver::Raw => self.file_len.div_ceil(512) * 512,
        }
    }

    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// The external data file its guest clusters are in, when it has one.
    pub fn data_file(&self) -> Option<&Path> {
        self.data.as_ref().map(|d| d.path.as_path())
    }

    /// The layer's version as its open descriptor sees it now: two stamps tell whether
    /// the file was written in place in between ([`LayerStamp::changed_in_place`]),
    /// which a process mapping the layer reads.
    pub fn stamp(&self) -> Result<LayerStamp> {
        stamp_of(&self.path, &self.file)
    }

    /// As [`stamp`](Self::stamp), of the external data file (`None` without one): the
    /// file a mapping of the layer's data reads.
    pub fn data_stamp(&self) -> Result<Option<LayerStamp>> {
        self.data.as_ref().map(|d| stamp_of(&d.path, &d.file)).transpose()
    }

    /// The file the layer's data extents point into, as (path, file, length when
    /// opened): its external data file, or the layer file itself.
    pub(crate) fn data_source(&self) -> (&Path, &File, u64) {
        match &self.data {
            Some(d) => (&d.path, &d.file, d.len),
            None => (&self.path, &self.file, self.file_len),
        }
    }

    /// The qcow2 cluster size, `None` for raw.
    pub(crate) fn cluster_size(&self) -> Option<u64> {
        match &self.driver {
            Driver::Qcow2(q) => Some(q.cluster_size()),
            Driver::Raw => None,
        }
    }

    /// `pread` of exactly `buf.len()` bytes of the layer file; a file that got shorter
    /// since it was opened is named as such rather than as a bare short read.
    pub(super) fn read_exact_at(&self, buf: &mut [u8], offset: LayerOffset) -> Result<()> {
        read_exact_of(&self.path, &self.file, self.file_len, buf, offset)
    }

    /// As [`read_exact_at`](Self::read_exact_at), of the file its data extents point
    /// into ([`data_source`](Self::data_source)).
    pub(super) fn read_data_at(&self, buf: &mut [u8], offset: LayerOffset) -> Result<()> {
        let (path, file, len) = self.data_source();
        read_exact_of(path, file, len, buf, offset)
    }

    fn info(&self, depth: usize) -> LayerInfo {
        let q = match &self.driver {
            Driver::Qcow2(q) => Some(q),
            Driver::Raw => None,
        };
        LayerInfo {
            depth,
            path: self.path.clone(),
            format: self.format(),
            virtual_size_bytes: self.virtual_size(),
            file_size_bytes: self.file_len,
            cluster_size_bytes: q.map(|q| q.cluster_size()),
            version: q.map(|q| q.version),
            backing_name: q.and_then(|q| q.backing.as_ref()).map(|b| String::from_utf8_lossy(b).into_owned()),
            backing_format: q.and_then(|q| q.backing_format.clone()),
            data_file: self.data_file().map(Path::to_path_buf),
            data_file_raw: q.is_some_and(|q| q.data_file_raw),
            crypt_method: q.map_or(0, |q| q.crypt_method),
            compression: q.map(|q| q.compression),
            extended_l2: q.is_some_and(|q| q.extended_l2),
            incompatible_features: q.map_or(0, |q| q.incompatible),
        }
    }

    pub(super) fn err(&self, why: impl Into<String>) -> Error {
        Error::Image { path: self.path.clone(), why: why.into() }
    }
}

fn stamp_of(path: &Path, file: &File) -> Result<LayerStamp> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = file.metadata().map_err(|e| Error::io(path, e))?;
    if m.file_type().is_block_device() {
        // Written and not yet flushed, the sectors are not counted (until writeback,
        // up to 30 s later) though a mapping of the device already reads them. Should
        // it fail, flushed writes still count.
        let _ = crate::sys::fs::layer::write_back_block_device(file);
    }
    Ok(LayerStamp {
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
        nlink: m.nlink(),
        sectors_written: m.file_type().is_block_device().then(|| sectors_written(m.rdev())).flatten(),
    })
}

/// The sectors written to block device `rdev` (field 7 of its sysfs `stat`; the
/// kernel's Documentation/block/stat.rst).
fn sectors_written(rdev: u64) -> Option<u64> {
    let (major, minor) = (rustix::fs::major(rdev), rustix::fs::minor(rdev));
    let stat = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/stat")).ok()?;
    stat.split_whitespace().nth(6)?.parse().ok()
}

fn read_exact_of(path: &Path, file: &File, len: u64, buf: &mut [u8], offset: LayerOffset) -> Result<()> {
    let err = |why: String| Error::Image { path: path.to_path_buf(), why };
    FileExt::read_exact_at(file, buf, offset.0).map_err(|e| match current_len(file) {
        Ok(now) if now < len => err(format!("shrank from {len} to {now} bytes since it was opened")),
        _ => err(format!("reading {offset}: {e}")),
    })
}

/// A qcow2 or raw image with its whole backing chain, every layer open read-only.
#[derive(Debug)]
pub struct Image {
    pub(super) layers: Vec<Layer>,
}

/// The first bytes of a file, where every format's magic is: read once, by `pread` at
/// offset 0 (the file position is not 0 after [`current_len`] of a block device).
struct Head {
    bytes: [u8; 0x44],
    len: usize,
}

impl Head {
    fn read(file: &File, path: &Path) -> Result<Self> {
        let mut bytes = [0u8; 0x44];
        let mut len = 0;
        while len < bytes.len() {
            match FileExt::read_at(file, &mut bytes[len..], len as u64) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(path, e)),
            }
        }
        Ok(Self { bytes, len })
    }

    fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    fn is_qcow2(&self) -> bool {
        self.bytes().starts_with(&qcow2::MAGIC)
    }
}

/// The format a file that is not qcow2 carries by its magic, when it is one qemu
/// knows and advm does not read: probing such a file as raw would map its metadata as
/// disk bytes (qemu's probe recognises them too).
fn other_format(head: &Head) -> Option<&'static str> {
    let head = head.bytes();
    let known: [(&[u8], &str); 9] = [
        (b"KDMV", "vmdk"),
        (b"COWD", "vmdk (version 3)"),
        (b"# Disk DescriptorFile", "vmdk (descriptor)"),
        (b"QED\0", "qed"),
        (b"conectix", "vpc (VHD)"),
        (b"vhdxfile", "vhdx"),
        (b"LUKS\xba\xbe", "LUKS (encrypted)"),
        (b"WithoutFreeSpace", "parallels"),
        (b"WithouFreSpacExt", "parallels"),
    ];
    if let Some((_, name)) = known.iter().find(|(magic, _)| head.starts_with(magic)) {
        return Some(name);
    }
    // VirtualBox: a text banner, then the signature 0xbeda107f at 0x40.
    if head.len() >= 0x44 && head[0x40..0x44] == 0xbeda_107f_u32.to_le_bytes() {
        return Some("vdi");
    }
    None
}

/// The length of a regular file or block device (whose `st_size` is 0).
pub(crate) fn current_len(file: &File) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::FileTypeExt;
    let meta = file.metadata()?;
    if meta.file_type().is_block_device() {
        // `&File` seeks the open file description; layers are read with pread only.
        let mut f = file;
        f.seek(SeekFrom::End(0))
    } else {
        Ok(meta.len())
    }
}

/// Why a file of this type cannot be a layer, or `None` if it can.
fn unfit_type(t: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if t.is_file() || t.is_block_device() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        Some("not a regular file")
    }
}

/// The commands that turn the layer at `path` into one advm reads: a qcow2 copy, and
/// for a backing file (of `overlay`) the overlay pointed at the copy (same contents,
/// so an unsafe rebase).
fn convert_hint(path: &Path, overlay: Option<&Path>) -> String {
    match overlay {
        None => format!("qemu-img convert -O qcow2 {} out.qcow2", path.display()),
        Some(overlay) => {
            // Absolute, since rebase reads a relative name from the overlay's directory.
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let out = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()).join("out.qcow2");
            format!(
                "qemu-img convert -O qcow2 {} {}, then qemu-img rebase -u -b {} -F qcow2 {}",
                path.display(),
                out.display(),
                out.display(),
                overlay.display()
            )
        }
    }
}

/// Opens `path` read-only, refused (`unfit`) unless it is a regular file or block
/// device; with its length.
fn open_typed(path: &Path, unfit: &dyn Fn(&str) -> Error) -> Result<(File, u64)> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if let Some(what) = unfit_type(meta.file_type()) {
        return Err(unfit(what));
    }
    let file = crate::sys::fs::layer::open_read_nonblocking(path).map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if let Some(what) = unfit_type(meta.file_type()) {
        return Err(unfit(what));
    }
    let len = current_len(&file).map_err(|e| Error::io(path, e))?;
    Ok((file, len))
}

/// `path` made absolute for a message: where a file named relative was looked for (the
/// name again said nothing for an image named relative).
fn shown_abs(path: &Path) -> String {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()).display().to_string()
}

/// Opens the external data file `layer`'s header names, if any: a relative name beside
/// the layer file, where `qemu-img create` made it (QEMU itself looks in its working
/// directory; advm must not depend on its own, a daemon's), asked of `may_open` first,
/// under the policy of backing files (inside `tree` unless `allow_backing_outside`, a
/// regular file or block device, no QEMU writer unless `force_share`).
fn open_data_file(
    layer: &mut Layer,
    tree: &Path,
    options: &ImageOptions,
    may_open: &dyn Fn(&Path) -> Result<()>,
) -> Result<()> {
    let Driver::Qcow2(q) = &mut layer.driver else { return Ok(()) };
    let Some(name) = &q.data_file else { return Ok(()) };
    let text = Path::new(std::ffi::OsStr::from_bytes(name)).display().to_string();
    let name_path = Path::new(std::ffi::OsStr::from_bytes(name));
    let resolved = if name_path.is_absolute() {
        name_path.to_path_buf()
    } else {
        layer.path.parent().unwrap_or(Path::new(".")).join(name_path)
    };
    let err = |why: String| Error::Image { path: layer.path.clone(), why };
    if text.contains(':') && !resolved.exists() && text.split(':').next().is_some_and(|p| !p.contains('/')) {
        return Err(err(format!("external data file {text:?} uses a protocol prefix; only local files are supported")));
    }
    may_open(&resolved)?;
    let canon = std::fs::canonicalize(&resolved).map_err(|e| {
        // QEMU 7.2 looks for a relative name in its working directory: an image made
        // with `qemu-img create -o data_file=sub/x.data sub/x.qcow2` names a file it
        // finds there and advm (beside the layer) does not. Say where it is and how to
        // record the name so that both find it.
        let here = (!name_path.is_absolute() && name_path.is_file()).then(|| shown_abs(name_path));
        let hint = here.map_or(String::new(), |here| {
            format!(
                "; QEMU, which looks for a relative name in its working directory, finds {here}: record it \
                 absolute, qemu-img amend -o data_file={here} {}",
                layer.path.display()
            )
        });
        err(format!("external data file {text:?} (resolved to {}): {e}{hint}", shown_abs(&resolved)))
    })?;
    if !options.allow_backing_outside && !canon.starts_with(tree) {
        return Err(err(format!(
            "external data file {text:?} resolves to {}, outside {}, the directory of the image opened; \
             refusing to follow it (allow with --allow-backing-outside, ImageOptions::allow_backing_outside)",
            canon.display(),
            tree.display()
        )));
    }
    let unfit = |what: &str| Error::Image {
        path: resolved.clone(),
        why: format!("is {what}; external data files must be regular files or block devices"),
    };
    let (file, len) = open_typed(&resolved, &unfit)?;
    if !options.force_share {
        refuse_writer_of(&resolved, &file)?;
    }
    q.set_data_len(len);
    layer.data = Some(DataFile { path: resolved, file, len });
    Ok(())
}

/// Opens the layer at `path`, read as `format` (`None`: probed), the backing file of
/// `overlay` (`None`: the image opened).
fn open_layer(path: &Path, format: Option<&str>, overlay: Option<&Path>) -> Result<Layer> {
    let err = |why: String| Error::Image { path: path.to_path_buf(), why };
    let unfit = |what: &str| err(format!("is {what}; image layers must be regular files or block devices"));
    // The type is checked before opening (opening a device can have effects of its
    // own), and again on the descriptor, in case the path changed in between; the
    // open does not block, so a FIFO cannot hang it.
    let (file, file_len) = open_typed(path, &unfit)?;
    let head = Head::read(&file, path)?;
    let is_qcow2 = head.is_qcow2();
    let convert = convert_hint(path, overlay);
    if format.is_none() && !is_qcow2 {
        if let Some(other) = other_format(&head) {
            return Err(err(format!(
                "is a {other} image, not qcow2 or raw; refusing to read it as raw (convert it: {convert})"
            )));
        }
    }
    let driver = match format {
        Some("qcow2") | None if is_qcow2 => Driver::Qcow2(qcow2::Qcow2::parse(&file, file_len, &convert).map_err(err)?),
        Some("qcow2") => return Err(err("backing format says qcow2 but the file has no qcow2 magic".into())),
        Some("raw") | None => Driver::Raw,
        Some(other) => {
            return Err(err(format!(
                "unsupported layer format {other:?} (supported: qcow2, raw); convert it: {convert}"
            )))
        }
    };
    Ok(Layer { path: path.to_path_buf(), file, file_len, driver, data: None })
}

impl Image {
    /// Opens `path` and every backing file below it, with the default (strict)
    /// [`ImageOptions`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, &ImageOptions::default())
    }

    /// Opens `path` and every backing file below it. Backing names are resolved
    /// relative to the directory of the file that names them, as qemu does, and must
    /// stay inside the directory tree of `path` (after symlinks) unless
    /// `allow_backing_outside`. The backing-format extension is honoured; without it
    /// a qcow2 backing file is recognised by its magic, and anything else is refused
    /// unless `allow_probed_raw`. Every layer must be a regular file or block device,
    /// and none may be open for writing in a QEMU (its write lock held) unless
    /// `force_share`.
    pub fn open_with(path: impl AsRef<Path>, options: &ImageOptions) -> Result<Self> {
        Self::open_checked(path.as_ref(), options, &|_| Ok(()))
    }

    /// [`Image::open_with`], asking `may_open` before each layer is looked at or opened
    /// (the image service refuses a path its peer may not read before anything about
    /// the file is seen).
    pub(crate) fn open_checked(
        path: &Path,
        options: &ImageOptions,
        may_open: &dyn Fn(&Path) -> Result<()>,
    ) -> Result<Self> {
        may_open(path)?;
        let mut top = open_layer(path, None, None)?;
        refuse_writer(&top, options)?;
        let top_dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let tree = std::fs::canonicalize(top_dir).map_err(|e| Error::io(top_dir, e))?;
        open_data_file(&mut top, &tree, options, may_open)?;
        let mut layers = vec![top];
        let mut seen = vec![std::fs::canonicalize(path).map_err(|e| Error::io(path, e))?];
        loop {
            let last = layers.last().expect("at least the top layer");
            let Driver::Qcow2(q) = &last.driver else { break };
            let Some(name) = &q.backing else { break };
            let text = Path::new(std::ffi::OsStr::from_bytes(name)).display().to_string();
            // QEMU's `file:` protocol names a local file; like every name with a
            // protocol, QEMU does not resolve it against the overlay's directory, so a
            // relative one is relative to the current directory.
            let (name_path, protocol) = match name.strip_prefix(b"file:") {
                Some(local) => (Path::new(std::ffi::OsStr::from_bytes(local)), true),
                None => (Path::new(std::ffi::OsStr::from_bytes(name)), false),
            };
            let resolved = if name_path.is_absolute() || protocol {
                name_path.to_path_buf()
            } else {
                last.path.parent().unwrap_or(Path::new(".")).join(name_path)
            };
            if !protocol
                && text.contains(':')
                && !resolved.exists()
                && text.split(':').next().is_some_and(|p| !p.contains('/'))
            {
                return Err(last.err(format!(
                    "backing file {text:?} uses a protocol prefix; only local files (and file:) are supported"
                )));
            }
            may_open(&resolved)?;
            let canon = std::fs::canonicalize(&resolved)
                .map_err(|e| last.err(format!("backing file {text:?} (resolved to {}): {e}", shown_abs(&resolved))))?;
            if let Some(i) = seen.iter().position(|s| *s == canon) {
                let chain: Vec<String> = layers.iter().map(|l| l.path.display().to_string()).collect();
                return Err(last.err(format!(
                    "backing loop: {} -> {} (already layer {i})",
                    chain.join(" -> "),
                    resolved.display()
                )));
            }
            if !options.allow_backing_outside && !canon.starts_with(&tree) {
                return Err(last.err(format!(
                    "backing file {text:?} resolves to {}, outside {}, the directory of the image opened; \
                     refusing to follow it (allow with --allow-backing-outside, ImageOptions::allow_backing_outside)",
                    canon.display(),
                    tree.display()
                )));
            }
            if layers.len() >= MAX_CHAIN_DEPTH {
                return Err(last.err(format!("backing chain deeper than {MAX_CHAIN_DEPTH} layers")));
            }
            let format = q.backing_format.clone();
            let mut layer = open_layer(&resolved, format.as_deref(), Some(&last.path))?;
            if format.is_none() && layer.format() == LayerFormat::Raw && !options.allow_probed_raw {
                return Err(last.err(format!(
                    "backing file {text:?} ({}) has no backing format and is not qcow2; refusing to probe it as raw \
                     (allow with --allow-probed-raw, ImageOptions::allow_probed_raw, or record the format: \
                     qemu-img rebase -u -b {text} -F raw)",
                    canon.display()
                )));
            }
            refuse_writer(&layer, options)?;
            open_data_file(&mut layer, &tree, options, may_open)?;
            seen.push(canon);
            layers.push(layer);
        }
        Ok(Self { layers })
    }

    /// The layers, top (the opened file) first.
    pub fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// Per-layer facts for `advm image info`.
    pub fn info(&self) -> Vec<LayerInfo> {
        self.layers.iter().enumerate().map(|(i, l)| l.info(i)).collect()
    }

    /// The virtual disk size (the top layer's).
    pub fn virtual_size(&self) -> u64 {
        self.layers[0].virtual_size()
    }
}
