//! docs/image.md's example: a two-layer qcow2 chain (made here with qemu-img), its
//! extent map, and its space mapped so that every reader shares the host's page cache.
//! `cargo run -p advm --example image` (needs qemu-img: Debian's qemu-utils)

use std::process::Command;

use advm::image::{GuestOffset, Image, ImageSpace, MapOptions};

fn qemu(tool: &str, args: &[&str]) -> Result<(), Box<dyn std::error::Error>> {
    let out = Command::new(tool).args(args).output().map_err(|e| format!("{tool}: {e} (install qemu-utils)"))?;
    if !out.status.success() {
        return Err(format!("{tool} {args:?}: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("advm-image-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (base, top) = (dir.join("base.qcow2"), dir.join("top.qcow2"));
    let (base, top) = (base.to_str().ok_or("temp dir not UTF-8")?, top.to_str().ok_or("temp dir not UTF-8")?);
    qemu("qemu-img", &["create", "-q", "-f", "qcow2", base, "64M"])?;
    qemu("qemu-io", &["-c", "write -P 0x11 0 8M", base])?; // the base layer's data
    qemu("qemu-img", &["create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", top])?;
    qemu("qemu-io", &["-c", "write -P 0x22 4M 1M", top])?; // the top layer overrides 1 MiB

    let image = Image::open(top)?; // the whole backing chain
    let map = image.extent_map()?; // (layer, offset) runs, zeros, compressed clusters
    println!("{} layers, {} bytes, {} extents", image.layers().len(), map.size, map.extents.len());
    for e in &map.extents {
        println!("  {e:?}");
    }

    let space = ImageSpace::map(top, &MapOptions::default())?; // MAP_PRIVATE of the layer files
    let mut b = [0u8; 1];
    for (at, want) in [(0, 0x11), (4 << 20, 0x22), (32 << 20, 0)] {
        space.read(GuestOffset(at), &mut b)?;
        assert_eq!(b[0], want, "byte at {at}");
    }
    println!("mapped at {:#x}: {:?}", space.addr(), space.stats());
    drop(space);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
