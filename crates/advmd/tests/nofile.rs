//! In a test binary of its own: it lowers the process's limit of open files, which
//! would starve the other daemon tests running beside it.

use advmd::{Config, Daemon};
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// A daemon holds a descriptor per client and per store file it shows: binding raises
/// the soft limit of open files to the hard one.
#[test]
fn binding_raises_the_open_files_limit_to_the_hard_limit() {
    let hard = getrlimit(Resource::Nofile).maximum;
    let low = hard.map_or(256, |h| h.min(256));
    setrlimit(Resource::Nofile, Rlimit { current: Some(low), maximum: hard }).unwrap();
    let dir = std::env::temp_dir().join(format!("advmd-test-{}-nofile", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let h = Daemon::bind(Config::at(dir.join("advmd.sock"))).unwrap().spawn();
    assert_eq!(getrlimit(Resource::Nofile).current, hard, "soft limit of open files after bind");
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}
