//! In a test binary of its own: it lowers the process's limit of open files for good.

use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use advmd::{Config, Daemon};
use rustix::process::{setrlimit, Resource, Rlimit};

/// CPU seconds this process has used (user + system), from its /proc/self/stat
/// (opened beforehand: no descriptor is free when it is read).
fn cpu_seconds(stat: &std::fs::File) -> f64 {
    let mut buf = vec![0u8; 4096];
    let n = stat.read_at(&mut buf, 0).unwrap();
    let stat = String::from_utf8_lossy(&buf[..n]);
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after_comm.split_whitespace().collect();
    // fields 14 and 15 of the file (utime, stime) are 12 and 13 after the comm
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// With every descriptor of the process in use, a connection waits in the listen
/// queue and accept fails (EMFILE) at once each time it is tried: the accept loop must
/// wait, not spin a CPU (it took a whole core, 93% in `top`, until a client left),
/// and serve the waiting client once a descriptor is free.
#[test]
fn a_daemon_out_of_descriptors_waits_for_one_without_spinning() {
    let dir = std::env::temp_dir().join(format!("advmd-test-{}-starved", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("advmd.sock");
    // binding raises the soft limit to the hard one: lower both
    setrlimit(Resource::Nofile, Rlimit { current: Some(64), maximum: Some(64) }).unwrap();
    let h = Daemon::bind(Config::at(&sock)).unwrap().spawn();
    let stat = std::fs::File::open("/proc/self/stat").unwrap();
    // This process's clients and the daemon's ends share the 64 descriptors: connect
    // until none is left (the last connections wait unaccepted in the listen queue).
    let mut clients = Vec::new();
    while let Ok(c) = UnixStream::connect(&sock) {
        clients.push(c);
        assert!(clients.len() < 64, "connected 64 clients under a limit of 64 descriptors");
    }
    std::thread::sleep(Duration::from_millis(200));
    let (t0, c0) = (Instant::now(), cpu_seconds(&stat));
    std::thread::sleep(Duration::from_secs(1));
    let cpu = (cpu_seconds(&stat) - c0) / t0.elapsed().as_secs_f64();
    // the clients leave: the daemon accepts again, and a new client is served
    clients.clear();
    std::thread::sleep(Duration::from_millis(300));
    let ch = advm::wire::Channel::connect(&sock).unwrap();
    advm::merge::protocol::Request::Usage.send(&ch).unwrap();
    let served = ch.recv().unwrap().is_some();
    drop((ch, h, stat));
    // unlink and rmdir, which take no descriptor: remove_dir_all opens the directory,
    // and under this limit the daemon's ends of the connections may still hold them all
    // (it failed with EMFILE once and left the directory)
    for f in [sock.clone(), dir.join("advmd.sock.lock")] {
        let _ = std::fs::remove_file(f);
    }
    let _ = std::fs::remove_dir(&dir);
    assert!(cpu < 0.3, "the daemon used {:.0}% of a CPU while out of descriptors", cpu * 100.0);
    assert!(served, "no reply once descriptors were free");
}
