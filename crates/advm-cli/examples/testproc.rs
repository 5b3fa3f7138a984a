//! `advm testproc`: small processes with a known memory layout, for tests and the demo.
//! Each prints `ready` on stdout once its memory is in place, then waits until its
//! stdin closes (or it is killed).

use std::io::{BufRead, Write};

use advm::sys::memfd;
use advm::sys::mman::{Backing, Mapping, Prot, Share};

use crate::CliError;

/// The layouts.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum TestProc {
    /// One memfd of PAGES pages, filled with distinct bytes, mapped shared at TIMES
    /// addresses and faulted in: RSS counts it TIMES times, distinct pages once.
    SharedPages {
        /// Pages in the memfd.
        #[arg(long, default_value_t = 1)]
        pages: usize,
        /// Number of mappings of it.
        #[arg(long, default_value_t = 2)]
        times: usize,
    },
    /// MIB mebibytes of private anonymous memory, written (distinct pages).
    Anon {
        /// Size in MiB.
        #[arg(long)]
        mib: usize,
        /// Also reserve this many GiB of empty address space (PROT_NONE), as arenas do.
        #[arg(long, default_value_t = 0)]
        reserve_gib: usize,
    },
}

/// Builds the layout, says `ready`, and waits for stdin to close.
pub fn run(which: TestProc) -> Result<(), CliError> {
    let ps = advm::addr::page_size();
    let mut keep = Vec::new();
    match which {
        TestProc::SharedPages { pages, times } => {
            let fd = memfd::create("advm-testproc")?;
            memfd::set_len(&fd, (pages * ps) as u64)?;
            // Every page gets different bytes, so nothing could merge them by content.
            let chunk_pages = 256;
            let mut buf = vec![0u8; chunk_pages * ps];
            for first in (0..pages).step_by(chunk_pages) {
                let n = chunk_pages.min(pages - first);
                for (i, b) in buf[..n * ps].iter_mut().enumerate() {
                    *b = ((first * ps + i) / ps * 31 + i) as u8;
                }
                let mut done = 0;
                while done < n * ps {
                    done += memfd::pwrite(&fd, &buf[done..n * ps], (first * ps + done) as u64)?;
                }
            }
            for _ in 0..times {
                let m = Mapping::new(
                    pages * ps,
                    Prot::READ,
                    Share::Shared,
                    Backing::File { fd: std::os::fd::AsFd::as_fd(&fd), offset: 0 },
                )?;
                m.populate(false)?;
                keep.push(m);
            }
        }
        TestProc::Anon { mib, reserve_gib } => {
            let m = Mapping::anonymous(mib << 20)?;
            m.populate(true)?;
            keep.push(m);
            if reserve_gib > 0 {
                keep.push(Mapping::reserve(reserve_gib << 30)?);
            }
        }
    }
    ready_and_wait()?;
    drop(keep);
    Ok(())
}

/// Says `ready` on stdout, then blocks until stdin closes: the protocol of every
/// helper process the tests and benchmarks spawn.
pub fn ready_and_wait() -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").and_then(|_| out.flush()).map_err(|e| CliError::Io("stdout".into(), e))?;
    drop(out);
    let mut line = String::new();
    while std::io::stdin().lock().read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
        line.clear();
    }
    Ok(())
}

/// A running testproc child, killed on drop.
pub struct Child {
    child: std::process::Child,
}

impl Child {
    /// Spawns `advm testproc ARGS` from this very binary and waits for `ready`.
    pub fn spawn(args: &[&str]) -> Result<Self, CliError> {
        let exe = std::env::current_exe().map_err(|e| CliError::Io("current_exe".into(), e))?;
        let mut child = std::process::Command::new(exe)
            .arg("testproc")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| CliError::Io("spawn advm testproc".into(), e))?;
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped");
        std::io::BufReader::new(stdout).read_line(&mut line).map_err(|e| CliError::Io("testproc stdout".into(), e))?;
        if line.trim() != "ready" {
            let _ = child.kill();
            return Err(CliError::Usage(format!("advm testproc {} did not get ready", args.join(" "))));
        }
        Ok(Self { child })
    }

    /// Its pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
