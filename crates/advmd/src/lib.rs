//! advmd, the advm daemon: runs capabilities for other processes over a UNIX socket.
//!
//! It serves merging ([`merge_service`]: a content-addressed page store per security
//! domain, the client's uid or a narrower tag inside it) and images
//! (`advm::image::service`: each qcow2 chain's mapping plan computed once, handed out
//! with the layer files to peers that may read them). Each
//! connection gets a thread of its own; a frame that stalls half-way, a reply the
//! client does not read, a malformed or hostile request, or a client that dies cost
//! that connection only. Requests are decoded into one [`Request`] enum, one variant
//! per service, and each service's handler lives in its own module.

mod error;
pub mod merge_service;
mod request;
mod slot_set;

use std::collections::HashMap;
use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use advm::wire::Channel;
pub use error::DaemonError;
pub use request::Request;

/// How long the accept loop waits before trying again after accept failed for want of
/// a resource (a descriptor, kernel memory).
const ACCEPT_RETRY: Duration = Duration::from_millis(20);

/// Writes `advmd: MESSAGE` on stderr in one write, and ignores a failure: stderr may
/// be a pipe whose reader went away (a journald restart, `advm daemon 2>&1 | head`),
/// and `eprintln!` would panic there, ending the daemon (or its accept loop).
pub fn say(message: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let line = format!("advmd: {message}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// How the daemon runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it listens.
    pub socket: PathBuf,
    /// Bytes each security domain's store may hold.
    pub domain_limit_bytes: u64,
    /// Connections served at once; more are refused with a reply saying so.
    pub max_clients: usize,
    /// Connections of one uid served at once: one uid's idle connections (which may
    /// wait forever) cannot take every slot from the others.
    pub max_clients_per_uid: usize,
    /// How long a frame may take once begun, and a reply to be taken.
    pub frame_timeout: Duration,
    /// Of an add's pages, the daemon hashes one in this many (picked at random) to
    /// check the client's hashes, and files the pages under the client's hashes; 1
    /// hashes every page and uses none of the client's. Sharing is decided by full
    /// compares either way (docs/merge.md, "Whose hashes").
    pub hash_check_one_in: usize,
}

impl Config {
    /// Defaults at `socket`: 4 GiB per domain, 4096 clients (1024 of one uid), 10 s
    /// per frame, one page in 64 of each add hashed by the daemon.
    pub fn at(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            domain_limit_bytes: 4 << 30,
            max_clients: 4096,
            max_clients_per_uid: 1024,
            frame_timeout: Duration::from_secs(10),
            hash_check_one_in: 64,
        }
    }
}

/// Longest socket path a UNIX socket address holds (`sun_path` is 108 bytes, with
/// the terminating NUL).
const MAX_SOCKET_PATH: usize = 107;

/// A bound daemon, ready to serve.
#[derive(Debug)]
pub struct Daemon {
    listener: UnixListener,
    /// `SOCKET.lock`, locked for the daemon's life: two daemons started at once on one
    /// path could otherwise both find a stale socket, and the second remove the
    /// first's new one.
    lock: std::fs::File,
    config: Config,
    services: Arc<Services>,
    /// Keeps closed sessions' pages until their processes exit.
    keeper: Arc<Keeper>,
    stop: Arc<AtomicBool>,
}

/// Every service's shared state.
#[derive(Debug)]
pub struct Services {
    /// The merge service.
    pub merge: merge_service::Stores,
    /// The image service.
    pub image: advm::image::service::Service,
}

/// Stops a daemon serving on another thread.
#[derive(Debug)]
pub struct Handle {
    stop: Arc<AtomicBool>,
    socket: PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The socket's lock, held until the socket is removed (after the accept loop has
    /// ended): a daemon starting meanwhile must not bind a socket this one then removes.
    lock: Option<std::fs::File>,
    /// The listener (a clone), to end the accept loop's wait when the socket's path no
    /// longer leads to it.
    waker: Option<UnixListener>,
    /// The services, to inspect in tests.
    pub services: Arc<Services>,
}

impl Handle {
    /// Stops accepting, and waits for the accept loop to end (open connections finish
    /// on their own threads).
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept by shutting the listener: a connect to the path woke
        // it only while the path led to it (stop hung for ever once the socket file was
        // removed, or another daemon's socket put there).
        match &self.waker {
            Some(l) if advm::wire::stop_accepting(l).is_ok() => {}
            _ => {
                let _ = UnixStream::connect(&self.socket);
            }
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // ours, unless something else has been put there since
        if std::fs::symlink_metadata(&self.socket).is_ok_and(|m| m.file_type().is_socket()) {
            let _ = std::fs::remove_file(&self.socket);
        }
        // Removed while still held: a daemon that opened it before and locks it after
        // finds it no longer at its path and refuses ([`Daemon::bind`]).
        if self.lock.is_some() {
            let _ = std::fs::remove_file(lock_path(&self.socket));
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// Binds and listens at `path`, open to every uid, so that the path appears only once
/// all of that is done: bound under a name of its own beside it, then renamed into
/// place. Bound at `path` itself, a client connecting between bind and listen was
/// refused (and fell back to a store of its own, as for no daemon at all), and one of
/// another uid between bind and chmod was denied. Bound in place only when the
/// temporary name would not fit in a socket address.
fn bind_in_place(path: &Path) -> Result<UnixListener, DaemonError> {
    let open_to_all = |p: &Path| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o666)).map_err(|e| DaemonError::io(p, e))
    };
    // per daemon: one process may run several (tests, an embedding program)
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let staged = path.with_file_name(format!(".advmd-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
    if staged.as_os_str().len() > MAX_SOCKET_PATH {
        let listener = UnixListener::bind(path).map_err(|e| DaemonError::io(path, e))?;
        open_to_all(path)?;
        return Ok(listener);
    }
    // left by a daemon that died with this pid (since reused)
    let _ = std::fs::remove_file(&staged);
    let listener = UnixListener::bind(&staged).map_err(|e| DaemonError::io(&staged, e))?;
    let placed =
        open_to_all(&staged).and_then(|()| std::fs::rename(&staged, path).map_err(|e| DaemonError::io(path, e)));
    if placed.is_err() {
        let _ = std::fs::remove_file(&staged);
    }
    placed.map(|()| listener)
}

impl Daemon {
    /// Binds the socket: creates its directory, replaces a stale socket nobody answers
    /// on (refuses to if a daemon does), and lets every uid connect (domains keep them apart).
    pub fn bind(mut config: Config) -> Result<Self, DaemonError> {
        // Clients name the socket from their own directories: a relative path would
        // be found by none of them (and the daemon's messages would not say where).
        config.socket = std::path::absolute(&config.socket).map_err(|e| DaemonError::io(&config.socket, e))?;
        let path = &config.socket;
        let len = path.as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(DaemonError::TooLong { path: path.clone(), len });
        }
        // a descriptor per client, and per store file each client is shown: the
        // default soft limit (1024) is reached by a few hundred clients
        let _ = advm::process::raise_open_files_limit();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| DaemonError::io(dir, e))?;
        }
        // Refused before a lock file is made beside it (`--socket /etc/passwd`).
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            not_a_socket(path, &meta)?;
        }
        let lock_path = lock_path(path);
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            // never through a link someone put there (the daemon runs as root)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&lock_path)
            .map_err(|e| DaemonError::io(&lock_path, e))?;
        // Locked, and still the file at its path: a stopping daemon removes it, and one
        // that opened it just before would otherwise hold a lock nobody else can see.
        if !advm::process::try_lock_file(&lock)? {
            return Err(DaemonError::Busy(path.clone()));
        }
        let id = |m: std::fs::Metadata| (m.dev(), m.ino());
        let held = id(lock.metadata().map_err(|e| DaemonError::io(&lock_path, e))?);
        if std::fs::symlink_metadata(&lock_path).ok().map(id) != Some(held) {
            return Err(DaemonError::Busy(path.clone()));
        }
        // Only a socket left behind by a daemon that died is replaced: the path may
        // name any file (the daemon runs as root), and binding needs it gone.
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            not_a_socket(path, &meta)?;
            match UnixStream::connect(path) {
                Ok(_) => return Err(DaemonError::Busy(path.clone())),
                // nobody listens: left by a daemon that died
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
                // (no permission, a full backlog...) a daemon may well be serving there
                Err(e) => return Err(DaemonError::Unknown { path: path.clone(), source: e }),
            }
            std::fs::remove_file(path).map_err(|e| DaemonError::io(path, e))?;
        }
        let listener = bind_in_place(path)?;
        let services = Arc::new(Services {
            merge: merge_service::Stores::new(config.domain_limit_bytes),
            image: advm::image::service::Service::new(advm::image::MapOptions::default()),
        });
        // Here, not when serving starts: clients may take every descriptor by then.
        let keeper = Arc::new(Keeper::spawn(services.clone()).map_err(DaemonError::Keeper)?);
        Ok(Self { listener, lock, config, services, keeper, stop: Arc::new(AtomicBool::new(false)) })
    }

    /// The socket it listens on.
    pub fn socket(&self) -> &Path {
        &self.config.socket
    }

    /// Serves on a thread of its own until the handle is stopped or dropped.
    pub fn spawn(self) -> Handle {
        let stop = self.stop.clone();
        let socket = self.config.socket.clone();
        let services = self.services.clone();
        let lock = self.lock.try_clone().ok();
        let waker = self.listener.try_clone().ok();
        let thread = std::thread::Builder::new().name("advmd-accept".into()).spawn(move || self.serve()).ok();
        Handle { stop, socket, thread, lock, waker, services }
    }

    /// Accepts connections until stopped, one thread each.
    pub fn serve(self) {
        // A thread per client: glibc gives threads that allocate at once arenas of
        // their own (up to 8 per CPU) and keeps what each freed, 50-80 MiB after 200
        // clients; a few arenas serve the daemon's short allocations as well.
        advm::process::limit_heap_arenas(HEAP_ARENAS);
        let live = Arc::new(AtomicUsize::new(0));
        let keeper = self.keeper.clone();
        let per_uid: Arc<std::sync::Mutex<HashMap<u32, usize>>> = Arc::default();
        let mut starved = false;
        for conn in self.listener.incoming() {
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            let sock = match conn {
                Ok(s) => s,
                Err(e) if matches!(e.kind(), ErrorKind::Interrupted | ErrorKind::ConnectionAborted) => continue,
                Err(e) => {
                    // Out of descriptors or kernel memory (EMFILE, ENFILE, ENOBUFS,
                    // ENOMEM): the connection stays queued and accept fails again at
                    // once, so retrying at once spins a CPU. Wait for a client to leave.
                    if !starved {
                        say(format_args!("accept: {e}; waiting connections are served once a client leaves"));
                        starved = true;
                    }
                    std::thread::sleep(ACCEPT_RETRY);
                    continue;
                }
            };
            starved = false;
            let mut ch = Channel::from_stream(sock);
            if ch.set_frame_timeout(self.config.frame_timeout).is_err() {
                continue;
            }
            if live.load(Ordering::SeqCst) >= self.config.max_clients {
                let _ =
                    request::refuse(&ch, &format!("advmd serves at most {} clients at once", self.config.max_clients));
                continue;
            }
            let Ok(peer) = ch.peer() else { continue };
            let most = self.config.max_clients_per_uid;
            let Some(slot) = UidSlot::take(&per_uid, peer.uid, most) else {
                let why =
                    format!("advmd serves at most {most} clients of one uid at once (uid {} has as many)", peer.uid);
                let _ = request::refuse(&ch, &why);
                continue;
            };
            live.fetch_add(1, Ordering::SeqCst);
            let (services, live2, timeout) = (self.services.clone(), live.clone(), self.config.frame_timeout);
            let check = self.config.hash_check_one_in;
            let keeper = keeper.clone();
            let spawned =
                std::thread::Builder::new().name("advmd-client".into()).stack_size(256 << 10).spawn(move || {
                    let kept = serve_client(ch, &services, timeout, check);
                    // The connection is over: its slots are free for the uid's other
                    // processes even while its session's pages are kept.
                    drop(slot);
                    let was = live2.fetch_sub(1, Ordering::SeqCst);
                    if let Some(kept) = kept {
                        keeper.keep(kept);
                    }
                    trim_heap(was == 1);
                });
            if spawned.is_err() {
                live.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// Arenas the daemon's heap may use.
const HEAP_ARENAS: u16 = 4;

/// How often at most the heap's free memory is given back while clients come and go.
const TRIM_EVERY: Duration = Duration::from_millis(200);

/// Gives the heap's free memory back to the kernel after a connection ended: always
/// when it was the last (`last`), else at most once per [`TRIM_EVERY`]. A daemon's
/// memory should not grow with the clients it served before.
fn trim_heap(last: bool) {
    static LAST_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let now = START.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64;
    let then = LAST_MS.load(Ordering::Relaxed);
    let due = now.saturating_sub(then) >= TRIM_EVERY.as_millis() as u64;
    if last || (due && LAST_MS.compare_exchange(then, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()) {
        advm::process::release_free_heap();
    }
}

/// One of a uid's connection slots, given back on drop.
struct UidSlot {
    counts: Arc<std::sync::Mutex<HashMap<u32, usize>>>,
    uid: u32,
}

impl UidSlot {
    /// A slot of `uid`'s, unless it has `most` already.
    fn take(counts: &Arc<std::sync::Mutex<HashMap<u32, usize>>>, uid: u32, most: usize) -> Option<Self> {
        let mut c = counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = c.entry(uid).or_default();
        if *n >= most {
            return None;
        }
        *n += 1;
        Some(Self { counts: counts.clone(), uid })
    }
}

impl Drop for UidSlot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = c.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                c.remove(&self.uid);
            }
        }
    }
}

/// Where a daemon's lock for `socket` is: `SOCKET.lock`.
fn lock_path(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

/// Refuses a path where something other than a socket is.
fn not_a_socket(path: &Path, meta: &std::fs::Metadata) -> Result<(), DaemonError> {
    let t = meta.file_type();
    if t.is_socket() {
        return Ok(());
    }
    let what = match () {
        _ if t.is_file() => "a regular file",
        _ if t.is_dir() => "a directory",
        _ if t.is_symlink() => "a symbolic link",
        _ => "a device or FIFO",
    };
    Err(DaemonError::NotASocket { path: path.to_path_buf(), what })
}

/// One connection: frames in, replies out, until the client leaves or breaks the
/// framing; then everything it held is released, or returned with a watch on its
/// process when that process may still map its pages.
fn serve_client(ch: Channel, services: &Services, timeout: Duration, hash_check_one_in: usize) -> Option<Kept> {
    let Ok(peer) = ch.peer() else { return None };
    // The process that connected, as the kernel recorded it then: its pid may name
    // another process by now (it exited before this thread started, and the pid was
    // reused), or by the time the connection closes. None: it has gone (or cannot be
    // told), and its session is kept only while some process maps its pages.
    let watch = ch.watch_peer().ok().flatten();
    let mut merge = merge_service::Session::new(peer, timeout, hash_check_one_in);
    loop {
        let frame = match ch.recv() {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                // The framing is lost (oversized, cut short, stalled): say why and hang up.
                let _ = request::refuse(&ch, &e.to_string());
                break;
            }
        };
        let service = frame.service;
        // A request refused is answered and the connection goes on; only a reply that
        // cannot be sent ends it.
        let outcome = match Request::decode(frame) {
            Ok(Request::Merge(r)) => match merge.handle(&services.merge, r) {
                Ok(reply) => reply.send(&ch),
                Err(e) => request::refuse_service(&ch, service, &e.to_string()),
            },
            Ok(Request::Image(r)) => {
                let (reply, fds) = services.image.handle(Some(peer), &r);
                reply.send(&ch, &fds)
            }
            Err(e) => request::refuse_service(&ch, service, &e.to_string()),
        };
        if outcome.is_err() {
            break;
        }
    }
    // A client may close its connection and live on (a program closing every descriptor
    // above stderr, `os.closerange`): its merged memory still maps the slots it was
    // handed, which, released now, would be punched and reused under it (its arrays
    // changed). Its claims end now; its references, kept by the [`Keeper`], once its
    // process has exited (or cannot be seen) and no process maps their pages any
    // more. A client holding nothing costs nothing past its connection.
    merge.end_claims();
    match watch {
        _ if !merge.holds_pages() => {
            merge.end(&services.merge);
            None
        }
        Some(w) if !w.has_exited().unwrap_or(true) => Some(Kept::Process(peer.pid, w, merge)),
        // Its process has gone (or cannot be seen): a child it forked may still map
        // its pages; the keeper releases those no process maps.
        _ => Some(Kept::Orphan(merge)),
    }
}

/// A closed session that still holds pages, for the [`Keeper`].
#[derive(Debug)]
enum Kept {
    /// Its process (pid, watch) lives on: kept until it exits.
    Process(i32, advm::process::ProcessWatch, merge_service::Session),
    /// Its process has exited: kept only while some process maps its pages.
    Orphan(merge_service::Session),
}

/// Keeps closed sessions' references until their processes exit, and then those a
/// forked child of theirs still maps: one thread for all of them, one pidfd and one
/// session per process and domain (a thread, a connection slot and a pidfd per closed
/// connection let a process that opens and closes connections in a loop take its
/// uid's every slot).
#[derive(Debug)]
struct Keeper {
    to: std::sync::Mutex<std::sync::mpsc::Sender<Kept>>,
    bell: UnixStream,
}

impl Keeper {
    fn spawn(services: Arc<Services>) -> std::io::Result<Self> {
        let (bell, ear) = UnixStream::pair()?;
        ear.set_nonblocking(true)?;
        let (to, from) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("advmd-keeper".into())
            .spawn(move || keep_until_exit(&services, &from, &ear))?;
        Ok(Self { to: std::sync::Mutex::new(to), bell })
    }

    /// Keeps a closed session.
    fn keep(&self, kept: Kept) {
        let sent = self.to.lock().unwrap_or_else(|p| p.into_inner()).send(kept);
        if sent.is_ok() {
            use std::io::Write;
            let _ = (&self.bell).write(&[1]);
        }
    }
}

/// How often the pages of sessions whose processes have exited are looked for in the
/// maps of the processes left.
const ORPHANS_EVERY: Duration = Duration::from_secs(1);

/// How often the pages of closed sessions whose processes live on are trimmed
/// ([`merge_service::Stores::trim_closed`]: one look at every process's maps, twice).
pub const KEPT_TRIM_EVERY: Duration = Duration::from_secs(10);

/// The keeper's thread: watches every kept session's process; once it has exited,
/// releases the session's references that no process maps, and looks again for the
/// rest every [`ORPHANS_EVERY`].
fn keep_until_exit(services: &Services, from: &std::sync::mpsc::Receiver<Kept>, ear: &UnixStream) {
    use std::io::Read;
    use std::os::fd::AsFd;
    // Per process: its watch and its sessions (one per domain).
    let mut kept: Vec<(i32, advm::process::ProcessWatch, Vec<merge_service::Session>)> = Vec::new();
    // Sessions of exited processes whose pages some process still maps.
    let mut orphans: Vec<merge_service::Session> = Vec::new();
    let mut orphans_seen = Instant::now();
    let mut kept_trimmed = Instant::now();
    loop {
        let mut news: Vec<_> = from.try_iter().collect();
        if news.is_empty() && kept.is_empty() && orphans.is_empty() {
            match from.recv() {
                Ok(n) => news.push(n),
                Err(_) => return,
            }
        }
        let mut exited = Vec::new();
        for k in news {
            let (pid, watch, session) = match k {
                Kept::Orphan(s) => {
                    exited.push(s);
                    continue;
                }
                Kept::Process(p, w, s) => (p, w, s),
            };
            // The same process's earlier entry, unless that one has exited (its pid
            // reused since): then the new watch is kept, and the old entry goes below.
            // Pid 0 (a process in a namespace the daemon cannot see) names no one.
            let live = kept.iter_mut().find(|(p, w, _)| pid > 0 && *p == pid && !w.has_exited().unwrap_or(true));
            match live {
                Some((_, _, sessions)) => {
                    let mut left = Some(session);
                    for s in sessions.iter_mut() {
                        left = left.and_then(|n| s.absorb(n, &services.merge));
                    }
                    // a domain this process kept no session of yet
                    sessions.extend(left);
                }
                None => kept.push((pid, watch, vec![session])),
            }
        }
        let watches: Vec<&advm::process::ProcessWatch> = kept.iter().map(|(_, w, _)| w).collect();
        // sessions of exited processes just handed over are looked at without waiting
        let trim_in = (!kept.is_empty()).then(|| KEPT_TRIM_EVERY.saturating_sub(kept_trimmed.elapsed()));
        let timeout = if !exited.is_empty() {
            Some(Duration::ZERO)
        } else {
            [(!orphans.is_empty()).then_some(ORPHANS_EVERY), trim_in].into_iter().flatten().min()
        };
        let gone = match advm::process::ProcessWatch::wait_any(&watches, ear.as_fd(), timeout) {
            Ok(g) => g,
            Err(e) => {
                say(format_args!("watching the processes of closed sessions: {e}"));
                std::thread::sleep(ACCEPT_RETRY);
                continue;
            }
        };
        let mut drained = [0u8; 64];
        while matches!((&*ear).read(&mut drained), Ok(n) if n > 0) {}
        for &i in gone.iter().rev() {
            exited.extend(kept.swap_remove(i).2);
        }
        if !orphans.is_empty() && orphans_seen.elapsed() >= ORPHANS_EVERY {
            exited.append(&mut orphans);
        }
        if !kept.is_empty() && kept_trimmed.elapsed() >= KEPT_TRIM_EVERY {
            kept_trimmed = Instant::now();
            services.merge.trim_closed();
        }
        if !exited.is_empty() {
            orphans_seen = Instant::now();
            orphans.extend(merge_service::Session::release_unmapped(exited, &services.merge));
            trim_heap(kept.is_empty() && orphans.is_empty());
        }
    }
}
