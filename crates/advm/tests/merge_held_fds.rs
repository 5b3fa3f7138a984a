//! A `merge::Client` the program holds itself, after the program closed every
//! descriptor it did not open and got the numbers back for its own files (a binary of
//! its own: closing descriptors would break tests running beside it).

use std::io::{Read, Seek, Write};
use std::os::fd::{IntoRawFd, RawFd};

use advm::mem::{page_size, Region};
use advm::merge::Client;

fn open_fds() -> Vec<RawFd> {
    std::fs::read_dir("/proc/self/fd").unwrap().filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

#[test]
fn a_held_client_whose_fds_the_program_reused_refuses_and_leaves_the_files_alone() {
    if advm::probe::facts().uffd_features.is_none() {
        eprintln!("skipped: userfaultfd not available here");
        return;
    }
    let ps = page_size();
    let before = open_fds();
    let mut client = Client::local(64 << 20, "test").unwrap();
    let mut a = Region::new(16 * ps).unwrap();
    a.bytes_mut().iter_mut().enumerate().for_each(|(i, x)| *x = (i / ps % 4) as u8 + 1);
    let want = a.bytes().to_vec();
    client.merge(a.bytes()).unwrap();
    let mut theirs: Vec<RawFd> = open_fds().into_iter().filter(|fd| !before.contains(fd)).collect();
    // The listing's own descriptor is closed by now.
    theirs.retain(|&fd| fd_is_open(fd));
    assert!(!theirs.is_empty(), "the client holds no descriptor");

    // The program closes them and opens files of its own under the same numbers.
    let dir = std::env::temp_dir().join(format!("advm-test-{}-heldfds", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut mine = Vec::new();
    for &fd in &theirs {
        let path = dir.join(format!("mine-{fd}"));
        let mut f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        f.write_all(&vec![0x5a; 4 * ps]).unwrap();
        move_to(f.into_raw_fd(), fd);
        mine.push((fd, path));
    }

    let mut b = Region::new(16 * ps).unwrap();
    b.bytes_mut().copy_from_slice(&want);
    let e = client.merge(b.bytes()).unwrap_err().to_string();
    assert!(e.starts_with("merge client is unusable: the program closed its descriptors"), "{e}");
    let e = client.usage().unwrap_err().to_string();
    assert!(e.contains("make a new client"), "{e}");
    drop(client);
    for (fd, path) in &mine {
        assert!(fd_is_open(*fd), "dropping the client closed the program's fd {fd}");
        let mut f = std::fs::File::open(path).unwrap();
        let mut got = Vec::new();
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        f.read_to_end(&mut got).unwrap();
        assert!(got.len() == 4 * ps && got.iter().all(|&x| x == 0x5a), "the client changed {}", path.display());
    }
    assert_eq!(a.bytes(), &want[..], "merged pages changed");
    assert_eq!(b.bytes(), &want[..]);
    // A new client works.
    assert!(Client::local(64 << 20, "test").unwrap().merge(b.bytes()).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether `fd` is open in this process.
fn fd_is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD reads a flag of a descriptor number; no memory involved.
    unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
}

/// Puts the file open at `from` (owned by the caller, given up here) at number `to`
/// (closing what was there) and closes `from`.
fn move_to(from: RawFd, to: RawFd) {
    // SAFETY: dup2 onto a number the test took from the client on purpose; `from` is
    // then released without closing it twice.
    unsafe {
        assert_eq!(libc::dup2(from, to), to);
        libc::close(from);
    }
}
