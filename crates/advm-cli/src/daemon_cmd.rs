//! `advm daemon [--socket PATH]`: runs advmd in the foreground (docs/deploy.md).

use std::time::Duration;

use advm::process::Awaited;

use crate::CliError;

/// Arguments of `advm daemon`.
#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    /// Where to listen (default: $ADVM_SOCKET, else /run/advm/advmd.sock).
    #[arg(long)]
    pub socket: Option<std::path::PathBuf>,
    /// Bytes each security domain's page store may hold (MiB).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
    pub domain_limit_mib: u64,
    /// Clients served at once; more are refused with a reply saying so.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_clients: u64,
    /// Clients of one uid served at once (its idle connections cannot take every slot).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_clients_per_uid: u64,
    /// Seconds a request may take to arrive once begun (and a reply to be read).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub frame_timeout_s: u64,
    /// Of each add's pages, hash one in N (picked at random) to check the client's
    /// hashes, and file the pages under the client's hashes; 1: hash every page and
    /// use none of the client's. Sharing is decided by full compares either way.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub check_hashes_one_in: u64,
}

/// Serves until SIGTERM or SIGINT, then removes the socket and returns; SIGHUP is
/// ignored (nothing to reload: every setting is an argument).
pub fn run(args: DaemonArgs) -> Result<(), CliError> {
    let socket = args.socket.unwrap_or_else(advm::wire::socket_path);
    let mut cfg = advmd::Config::at(&socket);
    cfg.domain_limit_bytes = args.domain_limit_mib << 20;
    cfg.max_clients = args.max_clients as usize;
    cfg.max_clients_per_uid = args.max_clients_per_uid as usize;
    cfg.frame_timeout = Duration::from_secs(args.frame_timeout_s);
    cfg.hash_check_one_in = args.check_hashes_one_in as usize;
    // Before any thread starts, so that every thread leaves them to this one.
    let signals = advm::process::AwaitedSignals::block()?;
    let d = advmd::Daemon::bind(cfg).map_err(|e| CliError::Usage(format!("daemon: {e}")))?;
    let socket = d.socket().to_path_buf();
    advmd::say(format_args!(
        "serving on {} (stores of at most {} MiB per domain)",
        socket.display(),
        args.domain_limit_mib
    ));
    let handle = d.spawn();
    loop {
        match signals.wait()? {
            Awaited::Hangup => {
                advmd::say(format_args!("SIGHUP ignored (no configuration to reload; restart to change settings)"))
            }
            sig => {
                let name = if sig == Awaited::Interrupt { "SIGINT" } else { "SIGTERM" };
                // Removes the socket; the connections end with the process, and their
                // clients' next requests fail at once (docs/deploy.md, "Stopping").
                handle.stop();
                advmd::say(format_args!("stopped on {name}; {} removed", socket.display()));
                return Ok(());
            }
        }
    }
}
