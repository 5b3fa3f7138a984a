//! `advm merge PID [--json]`: asks a process running under `advm run --mode merge` to
//! merge its large anonymous mappings now, waits, and prints what the merge did.

use advm_bench::fmt_bytes;

use crate::CliError;

/// Arguments of `advm merge`.
#[derive(Debug, clap::Args)]
pub struct MergeArgs {
    /// The process (started by `advm run --mode merge`, or one of its descendants).
    pub pid: u32,
    /// Print the agent's reply as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `advm merge`.
pub fn run(args: MergeArgs) -> Result<(), CliError> {
    let reply = advm::merge::agent::request(args.pid)?;
    if reply["ok"] != true {
        let why = reply["error"].as_str().unwrap_or("no reason given").to_string();
        return Err(CliError::Usage(format!("process {}: merge failed: {why}", args.pid)));
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&reply).expect("a JSON value serializes"));
        return Ok(());
    }
    let n = |k: &str| reply[k].as_u64().unwrap_or(0);
    let ps = advm::mem::page_size() as u64;
    let via = match &reply["via"] {
        v if v.get("daemon").is_some() => format!("advmd at {}", v["daemon"]["socket"].as_str().unwrap_or("?")),
        v => format!("this process's own store: {}", v["local"]["reason"].as_str().unwrap_or("?")),
    };
    outln!(
        "process {}: {} mapping(s), {} in {:.3} s\n  merged   {} pages ({}) with pages the store held\n  added    {} pages ({}) to the store\n  skipped  {} pages (zero, partial, refused, or written while merged: {})\n  store    {via}",
        args.pid,
        n("mappings"),
        fmt_bytes(n("bytes")),
        reply["seconds"].as_f64().unwrap_or(0.0),
        n("merged"),
        fmt_bytes(n("merged") * ps),
        n("added"),
        fmt_bytes(n("added") * ps),
        n("skipped"),
        n("busy"),
    );
    if let Some(s) = reply["stopped"].as_str() {
        outln!("  stopped early: {s}");
    }
    Ok(())
}
